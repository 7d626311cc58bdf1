# Shared by the scripts/*.sh result scripts (source it after setting PY and OUT).
gemm() {  # the fp32 GEMM speed of the moment, GFLOP/s (printed beside absolute times)
  "$PY" -c "import torch; from rlft.models.precision import gemm_gflops; print(f'{gemm_gflops(torch.float32, 1024, 576, 1536):.0f}')"
}
timed() {  # NAME CMD...: run CMD, append "NAME SECONDS" to $OUT/timings.txt
  local name=$1; shift
  local t0; t0=$(date +%s)
  "$@"
  echo "$name $(( $(date +%s) - t0 ))" >> "$OUT/timings.txt"
}
