#include "reference_curves.h"

#include <algorithm>
#include <cmath>

namespace gpt {

double straight_line_time(double h, double h_full, double t_full) {
  if (!(h_full < 1)) return NAN;
  return 1 + (t_full - 1) * (1 - h) / (1 - h_full);
}

std::vector<Point> lower_hull(std::vector<Point> points) {
  std::erase_if(points, [](const Point& p) { return !std::isfinite(p.h) || !std::isfinite(p.t); });
  std::sort(points.begin(), points.end(),
            [](const Point& a, const Point& b) { return a.h < b.h || (a.h == b.h && a.t < b.t); });
  std::vector<Point> hull;
  for (const Point& p : points) {
    if (!hull.empty() && hull.back().h == p.h) continue;  // the fastest of this h is in already
    // Monotone chain: drop the last vertex while it lies on or above the segment to p.
    while (hull.size() >= 2) {
      const Point& a = hull[hull.size() - 2];
      const Point& b = hull.back();
      const double cross = (b.h - a.h) * (p.t - a.t) - (b.t - a.t) * (p.h - a.h);
      if (cross > 0) break;  // b is below the segment a -> p: a vertex
      hull.pop_back();
    }
    hull.push_back(p);
  }
  return hull;
}

double hull_time(const std::vector<Point>& hull, double h) {
  if (hull.empty() || !std::isfinite(h)) return NAN;
  // A point measured a rounding above or below the ends still counts as on them.
  const double slack = 1e-9 * std::max(1.0, std::abs(hull.back().h));
  if (h < hull.front().h - slack || h > hull.back().h + slack) return NAN;
  if (h <= hull.front().h) return hull.front().t;
  for (size_t i = 1; i < hull.size(); ++i) {
    const Point& a = hull[i - 1];
    const Point& b = hull[i];
    if (h <= b.h) return a.t + (b.t - a.t) * (h - a.h) / (b.h - a.h);
  }
  return hull.back().t;
}

}  // namespace gpt
