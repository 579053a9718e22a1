// Geometry of the window strip kernel (attention/prefill_window_strip.cuh), shared verbatim by the
// kernel and its registration (src/kernels/attention_prefill_window_strip.cpp): plain C only.
#pragma once

enum {
  kWindowStripPositions = 8,    // positions a step; x 8 query heads = a warpgroup's 64 rows
  kWindowStripHeads = 8,        // query heads of a KV head: the GQA group it takes
  kWindowStripMaxWindow = 128,  // window_left at most: 8 positions' windows fill 17 of the band's 18 blocks
  kWindowStripBandBlocks = 18,  // 8-key blocks in a step's band (144 keys)
  kWindowStripWarpgroups = 2,   // a CTA's warpgroups, taking its steps in turn
  kWindowStripQBuffers = 4,     // steps copied or computed at once: the pair computed and the next
  kWindowStripRingBlocks = 21,  // ring slots: the bands of the steps in flight
  kWindowStripThreads = 128 * kWindowStripWarpgroups,
  // Q buffers (8 KB), K and V rings whose first kWindowStripBandBlocks - 1 slots repeat after the
  // last (1 KB a block), an mbarrier per pair of steps in flight, and slack to align the tiles to
  // 1024 bytes.
  kWindowStripSharedBytes = kWindowStripQBuffers * 8192 + 2 * (kWindowStripRingBlocks + kWindowStripBandBlocks - 1) * 1024 +
                            8 * kWindowStripQBuffers / kWindowStripWarpgroups + 1024,
};
