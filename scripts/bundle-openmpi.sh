#!/usr/bin/env bash
# Copies Open MPI's runtime (mpirun, orted, the MCA components, PMIx's, the help texts) from this
# machine's Debian packages into DEST/openmpi, in the layout Debian installs them (relative to
# /usr), and the shared libraries they need into DEST/lib, so that a machine without Open MPI
# can run `mpirun -np 2` on one node (gpu-bundle.sh calls it: the lent GPU machines have none).
# There, relocate it with openmpi-env.sh: `. DEST/openmpi/openmpi-env.sh DEST` sets OPAL_PREFIX,
# PMIX_INSTALL_PREFIX, PATH and XPIPE_MPIRUN; run mpirun with DEST/lib on LD_LIBRARY_PATH (not
# set there: other programs, such as PyTorch, should not load these libraries). Components whose libraries are not Open MPI's
# own or the C library's (UCX, libfabric, PSM, verbs, Java) are left out: one node needs the
# shared-memory and TCP ones only.
#   scripts/bundle-openmpi.sh DEST
set -euo pipefail
dest=${1:?usage: bundle-openmpi.sh DEST}
orterun=$(readlink -f "$(command -v orterun || true)")
[[ -x "$orterun" ]] || { echo "bundle-openmpi.sh: no orterun here (Debian: openmpi-bin)" >&2; exit 1; }
usr=$(dirname "$(dirname "$orterun")")  # /usr
components=$(find "$usr/lib" -path '*openmpi/lib/openmpi3' -type d | head -1)
pmix=$(find "$usr/lib" -maxdepth 2 -type d -name 'pmix2' | head -1)
[[ -n "$components" ]] || { echo "bundle-openmpi.sh: no Open MPI components under $usr/lib" >&2; exit 1; }
out="$dest/openmpi"
mkdir -p "$out/usr/bin" "$dest/lib"

# A library the bundle may rely on: Open MPI's own and the few it is built on, or the C library's.
allowed='^(libmpi|libmca_common|libmunge|libopen-rte|libopen-pal|libpmix|libhwloc|libevent|libz|libudev|libc|libm|libdl|libpthread|librt|ld-linux|linux-vdso|libgcc_s|libstdc\+\+)'
keep() {  # whether every library `file` needs is allowed
  ldd "$1" 2>/dev/null | awk '{print $1}' | sed 's,.*/,,' | grep -vE "$allowed" | grep -q . && return 1
  return 0
}
copy_libs() {  # the libraries `file` needs, but the C library's, into DEST/lib
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    case "$name" in libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*) continue ;; esac
    [[ -e "$dest/lib/$name" ]] || cp "$(readlink -f "$path")" "$dest/lib/$name"
  done
}

cp "$orterun" "$out/usr/bin/orterun"
ln -sf orterun "$out/usr/bin/mpirun"
cp "$(readlink -f "$usr/bin/orted")" "$out/usr/bin/orted"
copy_libs "$orterun"
copy_libs "$usr/bin/orted"
kept=0 skipped=0
mkdir -p "$out${components}"
for so in "$components"/*.so; do
  if keep "$so"; then
    cp "$so" "$out${components}/"
    copy_libs "$so"
    kept=$((kept + 1))
  else
    skipped=$((skipped + 1))
  fi
done
mkdir -p "$out/usr/share"
cp -r "$usr/share/openmpi" "$out/usr/share/"
if [[ -n "$pmix" ]]; then
  mkdir -p "$out${pmix}/lib" "$out${pmix}/share"
  for so in "$pmix"/lib/pmix/*.so; do
    mkdir -p "$out${pmix}/lib/pmix"
    if keep "$so"; then cp "$so" "$out${pmix}/lib/pmix/"; copy_libs "$so"; fi
  done
  cp -r "$pmix/share/." "$out${pmix}/share/"
fi
cat >"$out/openmpi-env.sh" <<EOF
# Sourced with the bundle's folder: . openmpi/openmpi-env.sh BUNDLE (bash).
xpipe_bundle=\$(cd "\${1:?usage: . openmpi-env.sh BUNDLE}" && pwd)
export OPAL_PREFIX="\$xpipe_bundle/openmpi$usr"
${pmix:+export PMIX_INSTALL_PREFIX="\$xpipe_bundle/openmpi$pmix"}
export PATH="\$OPAL_PREFIX/bin:\$PATH"
export XPIPE_MPIRUN="\$OPAL_PREFIX/bin/mpirun"
# One node: mpirun starts its ranks itself, but refuses to start without a remote shell to name.
export OMPI_MCA_plm_rsh_agent="\${OMPI_MCA_plm_rsh_agent:-false}"
# PMIx reads its help texts from where Debian put them, absent here: no warning about them.
export PMIX_MCA_pcompress_base_silence_warning=1
EOF
pmix_note=""
[[ -n "$pmix" ]] && pmix_note=" and the PMIx components"
echo "bundle-openmpi: $out: mpirun, orted, $kept components ($skipped left out: libraries beyond" \
  "Open MPI's own)$pmix_note; $(du -sh "$out" | cut -f1)"
