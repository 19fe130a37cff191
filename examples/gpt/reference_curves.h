// --sweep's yardsticks for the planner's curve, in (h, T): h the bytes held for backward as a
// fraction of no checkpointing's, T the step time in x of no checkpointing's.
#pragma once

#include <vector>

namespace gpt {

struct Point {
  double h = 0, t = 0;
};

// The straight line from no checkpointing (1, 1) to full checkpointing (h_full, t_full), at h:
// 1 + (t_full - 1)(1 - h)/(1 - h_full). What dropping bytes costs if every byte costs the same as
// under full checkpointing. NAN when h_full is not below 1.
double straight_line_time(double h, double h_full, double t_full);

// The lower convex hull of `points` (the fixed policies' (h, T)), left to right: what mixing the
// fixed policies could reach. Of points with the same h the fastest counts; the non-finite are
// left out.
std::vector<Point> lower_hull(std::vector<Point> points);

// The hull's T at h, between its vertices on a straight line; NAN outside its range of h (no
// fixed policy holds that few bytes, or that many).
double hull_time(const std::vector<Point>& hull, double h);

}  // namespace gpt
