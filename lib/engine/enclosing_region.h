// What encloses a region whose forward is starting on this thread.
#pragma once

namespace recompose::detail {

// True when the innermost region whose forward runs on this thread (the one enclosing a region
// that starts now) recomputes by running its forward again (full checkpointing: no selective
// replay), outside any recomputation. Its recomputation then runs every region nested in it again,
// so what a nested selective region would keep in this forward is never what backward reads:
// see Note [ Kept outputs under an enclosing full region ]. Call before the new region's frame
// becomes the innermost (from RegionContexts::enter_forward()).
bool enclosing_region_reruns_its_forward();

}  // namespace recompose::detail
