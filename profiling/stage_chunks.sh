#!/bin/bash
# Cut the staged parts (vllm_stage.sh's p1 p2, the FlashInfer parts fj1 fj2 of profiling/README.md)
# into chunks that each fit one device call beside the tree (64 MiB in all), FlashInfer first:
#   bash profiling/stage_chunks.sh [PARTS (default: "fj1 fj2 p1 p2")] [CHUNKS (default 4)]
# writes .stage/c0 .. c<N-1>, each a `part` and a `take.sh`. On the device, one call per chunk
# back to back (the machine keeps /tmp only while warm), carrying that chunk's folder:
#   bash .stage/c0/take.sh                      # copies the chunk to /tmp (add work after it)
#   bash .stage/c1/take.sh fi                   # ... and unpacks FlashInfer (complete by then)
#   bash .stage/c2/take.sh
#   bash .stage/c3/take.sh all                  # ... and unpacks vLLM
# (2026-12-04: four chunks of 47 MiB; FlashInfer complete after two, vLLM after four.)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)/.stage"
parts=${1:-fj1 fj2 p1 p2}; n=${2:-4}
rm -rf c[0-9] stream.tar
tar -cf stream.tar $parts
split -n "$n" -d -a 1 stream.tar chunk.
rm stream.tar
for i in $(seq 0 $((n - 1))); do
  mkdir c$i && mv chunk.$i c$i/part
  cat > c$i/take.sh <<'EOS'
#!/bin/bash
# this chunk of the parts' stream into /tmp/stg.N; "fi" / "all": unpack what is complete by now
here=$(cd "$(dirname "$0")" && pwd); n=${here##*c}
cp "$here/part" /tmp/stg.$n
mkdir -p /tmp/stg
case "${1:-}" in
  fi)  cat /tmp/stg.[0-9] | tar -C /tmp/stg -xf - fj1 fj2 2>/dev/null
       bash /tmp/stg/fj1/unpack.sh && bash /tmp/stg/fj2/unpack.sh ;;
  all) cat /tmp/stg.[0-9] | tar -C /tmp/stg -xf - p1 p2 && bash /tmp/stg/p1/unpack.sh \
         && bash /tmp/stg/p2/unpack.sh ;;
esac
echo "chunk $n staged: $(ls /tmp/stg.* | tr '\n' ' ')"
EOS
  chmod +x c$i/take.sh
done
du -sh c[0-9]
