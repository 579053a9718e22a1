// NVRTC 13.0 dies with SIGSEGV in nvrtcCompileProgram on this input (sm_90a): a wgmma whose
// descriptors are compile-time zeros. The isolation test compiles it in the real worker.
extern "C" __global__ void k(float* out) {
  float d[8] = {0};
  unsigned long long da = 0, db = 0;
  asm volatile("wgmma.fence.sync.aligned;\n");
  asm volatile(
      "{\nwgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, 1, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db));
  asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n");
  for (int i = 0; i < 8; ++i) out[threadIdx.x * 8 + i] = d[i];
}
