//! Line charts with error bars, written as PNG or SVG.
//!
//! A [`Figure`] is one row of [`Panel`]s that share the x axis (its label and scale); each
//! panel has a y axis of its own. Every [`Series`] is a line through its points (sorted by
//! x), a marker at each point and a vertical error bar from [`Point::lo`] to [`Point::hi`].
//! One legend for the whole figure sits in a strip to the right of the panels, so it never
//! covers data; a series name has the same colour and marker shape in every panel. A dense
//! line (a distribution's hundred points) has markers at about a dozen of its points only.
//!
//! Text is drawn with DejaVu Sans, which is compiled into the crate: no system font library
//! is needed. Bad data never panics: points with a non-finite x or y are left out,
//! non-positive values on a log axis are drawn at a small positive floor, and empty panels
//! or series give empty axes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use ab_glyph::FontRef;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

mod axis;
mod text;

use axis::{tick_label, Axis};
use text::{Label, Mode};

/// A figure: a title over one row of panels that share the x axis.
#[derive(Clone, Debug)]
pub struct Figure {
    /// Drawn centred above the panels.
    pub title: String,
    /// The x axis label, drawn under every panel.
    pub x_label: String,
    /// Whether the x axis (shared by all panels) is logarithmic.
    pub x_log: bool,
    /// The panels, drawn side by side from left to right.
    pub panels: Vec<Panel>,
}

/// One chart of a [`Figure`], with a y axis of its own.
#[derive(Clone, Debug)]
pub struct Panel {
    /// The y axis label, drawn rotated left of the axis.
    pub y_label: String,
    /// Whether the y axis is logarithmic.
    pub y_log: bool,
    /// The lines of this panel.
    pub series: Vec<Series>,
}

/// One line of a [`Panel`]. Series of the same name look alike in every panel and share one
/// legend entry.
#[derive(Clone, Debug)]
pub struct Series {
    /// The legend entry.
    pub name: String,
    /// The points, in any order: the line joins them sorted by x.
    pub points: Vec<Point>,
}

/// One measurement.
/// y is the median; lo..hi the spread (error bar), lo <= y <= hi.
#[derive(Clone, Debug)]
pub struct Point {
    /// The position on the x axis.
    pub x: f64,
    /// The median; a point whose y is not finite is left out.
    pub y: f64,
    /// The bottom of the error bar (taken as `y` if not finite).
    pub lo: f64,
    /// The top of the error bar (taken as `y` if not finite); no bar is drawn unless
    /// `hi > lo`.
    pub hi: f64,
}

/// Draws `fig` as a PNG image at `path`.
///
/// The image is written to a temporary file in the same directory and renamed into place, so
/// `path` never holds a partly written image.
///
/// # Errors
///
/// A message naming `path` if the image cannot be drawn or written.
pub fn draw_png(fig: &Figure, path: &Path) -> Result<(), String> {
    let fail = |e: String| format!("cannot write PNG {}: {e}", path.display());
    let plan = Plan::new(fig, Mode::Raster).map_err(fail)?;
    let tmp = temp_sibling(path).map_err(fail)?;
    let drawn = (|| -> Result<(), String> {
        let root = BitMapBackend::new(&tmp, (plan.width, plan.height)).into_drawing_area();
        render(&root, fig, &plan).map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())
    })();
    // The backend is gone here: on an error its drop may just have written the file.
    let renamed = drawn.and_then(|()| std::fs::rename(&tmp, path).map_err(|e| e.to_string()));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    renamed.map_err(fail)
}

/// Draws `fig` as an SVG image at `path`, with the same layout as [`draw_png`].
///
/// # Errors
///
/// A message naming `path` if the image cannot be drawn or written.
pub fn draw_svg(fig: &Figure, path: &Path) -> Result<(), String> {
    let fail = |e: String| format!("cannot write SVG {}: {e}", path.display());
    let plan = Plan::new(fig, Mode::Svg).map_err(fail)?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (plan.width, plan.height)).into_drawing_area();
        render(&root, fig, &plan).map_err(|e| fail(e.to_string()))?;
        root.present().map_err(|e| fail(e.to_string()))?;
    }
    std::fs::write(path, svg).map_err(|e| fail(e.to_string()))
}

// ---------------------------------------------------------------------------------------
// Sizes (pixels)

/// Font sizes, in pixels to the em.
const TITLE_EM: f64 = 22.0;
const DESC_EM: f64 = 16.0;
const TICK_EM: f64 = 13.0;
const LEGEND_EM: f64 = 14.0;

/// The height of a figure, unless its legend needs more.
const HEIGHT: u32 = 540;
const TITLE_H: u32 = 46;
/// The width of one panel, its axis labels included.
const PANEL_W: u32 = 660;
const LEGEND_MIN_W: u32 = 180;
const LEGEND_MAX_W: u32 = 420;
/// Left of the legend text: the sample line with its marker.
const LEGEND_SAMPLE_W: u32 = 58;
const LEGEND_ROW_H: u32 = 26;
/// The longest series name the legend shows whole.
const LEGEND_MAX_CHARS: usize = 40;

/// Space around each panel's chart.
const MARGIN_TOP: u32 = 14;
const MARGIN_RIGHT: u32 = 28;
const MARGIN_LEFT: u32 = 10;
const MARGIN_BOTTOM: u32 = 6;
/// Tick marks point out of the chart.
const TICK_LEN: i32 = 5;
/// Between a tick mark and its label.
const TICK_GAP: i32 = 4;
/// Between the tick labels and the axis label.
const DESC_GAP: i32 = 10;
/// The least room between two x tick labels.
const X_LABEL_GAP: u32 = 14;

const LINE_WIDTH: u32 = 2;
const MARKER_R: i32 = 5;
/// A line of more points than this is dense: markers at every point would merge into a
/// band, so it marks about [`DENSE_MARKS`] of them, evenly spaced, and its last.
const DENSE: usize = 40;
const DENSE_MARKS: usize = 10;
const CAP_HALF_W: i32 = 4;

const GRID_MINOR: RGBColor = RGBColor(0xf0, 0xf0, 0xf0);
const GRID_MAJOR: RGBColor = RGBColor(0xd8, 0xd8, 0xd8);
const AXIS: RGBColor = RGBColor(0x40, 0x40, 0x40);

// ---------------------------------------------------------------------------------------
// Colours and markers

/// The Tableau 10 palette.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// Marker shapes, so that lines stay apart without colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Circle,
    Square,
    TriangleUp,
    Diamond,
    TriangleDown,
    Cross,
}

const SHAPES: [Shape; 6] = [
    Shape::Circle,
    Shape::Square,
    Shape::TriangleUp,
    Shape::Diamond,
    Shape::TriangleDown,
    Shape::Cross,
];

/// How a series looks.
#[derive(Clone, Copy, Debug)]
struct Look {
    color: RGBColor,
    shape: Shape,
}

impl Look {
    /// The look of the `i`-th distinct series name: 30 combinations before one repeats.
    fn nth(i: usize) -> Look {
        Look {
            color: PALETTE[i % PALETTE.len()],
            shape: SHAPES[i % SHAPES.len()],
        }
    }
}

/// Evaluates `$body` with `$e` bound to the marker element (anchored at `$at`, drawn in
/// pixels around it) for `$look`: each shape is an element of a type of its own.
macro_rules! with_marker {
    ($at:expr, $look:expr, |$e:ident| $body:expr) => {{
        let at = $at;
        let look: Look = $look;
        let fill = ShapeStyle::from(&look.color).filled();
        let edge = ShapeStyle::from(&WHITE).stroke_width(1);
        let r = MARKER_R;
        let outline = |points: &[(i32, i32)]| {
            let mut closed = points.to_vec();
            closed.extend(points.first().copied());
            closed
        };
        let polygon: Option<Vec<(i32, i32)>> = match look.shape {
            Shape::Square => {
                let s = r - 1;
                Some(vec![(-s, -s), (s, -s), (s, s), (-s, s)])
            }
            Shape::TriangleUp => Some(vec![(0, -r - 1), (r + 1, r - 1), (-r - 1, r - 1)]),
            Shape::TriangleDown => Some(vec![(0, r + 1), (-r - 1, -r + 1), (r + 1, -r + 1)]),
            Shape::Diamond => Some(vec![(0, -r - 1), (r + 1, 0), (0, r + 1), (-r - 1, 0)]),
            Shape::Circle | Shape::Cross => None,
        };
        match (look.shape, polygon) {
            (_, Some(points)) => {
                let $e = EmptyElement::at(at)
                    + Polygon::new(points.clone(), fill)
                    + PathElement::new(outline(&points), edge);
                $body
            }
            (Shape::Cross, None) => {
                let thick = ShapeStyle::from(&look.color).stroke_width(3);
                let $e = EmptyElement::at(at)
                    + PathElement::new(vec![(-r, -r), (r, r)], thick)
                    + PathElement::new(vec![(-r, r), (r, -r)], thick);
                $body
            }
            (_, None) => {
                let $e = EmptyElement::at(at)
                    + Circle::new((0, 0), r, fill)
                    + Circle::new((0, 0), r, edge);
                $body
            }
        }
    }};
}

// ---------------------------------------------------------------------------------------
// Layout

/// A point as drawn: non-finite points left out, the error bar only where it has length.
#[derive(Clone, Copy, Debug)]
struct Drawn {
    x: f64,
    y: f64,
    bar: Option<(f64, f64)>,
}

/// The points of a series to draw, sorted by x.
fn drawn_points(series: &Series) -> Vec<Drawn> {
    let mut points: Vec<Drawn> = series
        .points
        .iter()
        .filter(|p| p.x.is_finite() && p.y.is_finite())
        .map(|p| {
            let lo = if p.lo.is_finite() { p.lo.min(p.y) } else { p.y };
            let hi = if p.hi.is_finite() { p.hi.max(p.y) } else { p.y };
            Drawn {
                x: p.x,
                y: p.y,
                bar: (hi > lo).then_some((lo, hi)),
            }
        })
        .collect();
    points.sort_by(|a, b| a.x.total_cmp(&b.x));
    points
}

/// The points of a line that get a marker: all of them, or for a [`DENSE`] line every k-th
/// (from the first) and the last.
fn marked<T>(points: &[T]) -> impl Iterator<Item = &T> {
    let stride = if points.len() > DENSE {
        points.len() / DENSE_MARKS
    } else {
        1
    };
    let last = points.len().saturating_sub(1);
    points
        .iter()
        .enumerate()
        .filter(move |(i, _)| i % stride == 0 || *i == last)
        .map(|(_, p)| p)
}

/// Everything decided before drawing: sizes, axes, looks, legend.
struct Plan {
    mode: Mode,
    font: &'static FontRef<'static>,
    width: u32,
    height: u32,
    legend_w: u32,
    x_axis: Axis,
    /// Per panel: its y axis and the width of its widest tick label.
    panels: Vec<(Axis, u32)>,
    /// Series names in order of first appearance, with their looks.
    legend: Vec<(String, Look)>,
    looks: HashMap<String, Look>,
}

/// The room left of a chart: the axis label, the tick labels (`widest`) and the tick marks.
fn y_label_area(widest: u32) -> u32 {
    text::line_height(DESC_EM) + DESC_GAP as u32 + widest + (TICK_GAP + TICK_LEN) as u32
}

/// The room under a chart: the tick marks, the tick labels and the axis label.
fn x_label_area() -> u32 {
    (TICK_LEN + TICK_GAP) as u32
        + text::line_height(TICK_EM)
        + DESC_GAP as u32
        + text::line_height(DESC_EM)
}

impl Plan {
    fn new(fig: &Figure, mode: Mode) -> Result<Plan, String> {
        let font = text::font()?;
        let mut legend: Vec<(String, Look)> = Vec::new();
        let mut looks = HashMap::new();
        let mut xs = Vec::new();
        for series in fig.panels.iter().flat_map(|p| &p.series) {
            if !looks.contains_key(&series.name) {
                let look = Look::nth(legend.len());
                looks.insert(series.name.clone(), look);
                legend.push((series.name.clone(), look));
            }
            xs.extend(drawn_points(series).iter().map(|p| p.x));
        }

        let mut panels = Vec::with_capacity(fig.panels.len());
        for panel in &fig.panels {
            let mut ys = Vec::new();
            for p in panel.series.iter().flat_map(drawn_points) {
                ys.push(p.y);
                if let Some((lo, hi)) = p.bar {
                    ys.extend([lo, hi]);
                }
            }
            let axis = Axis::new(&ys, panel.y_log, true, 9);
            let widest = axis
                .major
                .iter()
                .map(|v| text::width(font, TICK_EM, &tick_label(*v)))
                .max()
                .unwrap_or(0);
            panels.push((axis, widest));
        }

        // As many x ticks as fit the narrowest chart without their labels touching.
        let widest_y = panels.iter().map(|(_, w)| *w).max().unwrap_or(0);
        let chart_w = PANEL_W.saturating_sub(MARGIN_LEFT + MARGIN_RIGHT + y_label_area(widest_y));
        let mut x_axis = Axis::new(&xs, fig.x_log, false, 2);
        for max_ticks in (2..=11).rev() {
            let axis = Axis::new(&xs, fig.x_log, false, max_ticks);
            if x_labels_fit(&axis, font, chart_w) {
                x_axis = axis;
                break;
            }
        }

        let mut legend_w = LEGEND_MIN_W;
        for (name, _) in &legend {
            let w = text::width(font, LEGEND_EM, &legend_text(name));
            legend_w = legend_w.max(LEGEND_SAMPLE_W + w + 16);
        }
        let legend_w = legend_w.min(LEGEND_MAX_W);
        let n = fig.panels.len().max(1) as u32;
        let title_w = text::width(font, TITLE_EM, &fig.title) + 40;
        let width = (n * PANEL_W + legend_w).max(title_w).min(20_000);
        Ok(Plan {
            mode,
            font,
            width,
            height: HEIGHT
                .max(TITLE_H + MARGIN_TOP + LEGEND_ROW_H * legend.len().min(500) as u32 + 10),
            legend_w,
            x_axis,
            panels,
            legend,
            looks,
        })
    }
}

/// Whether the tick labels of `axis` keep apart along a chart `chart_w` pixels wide.
fn x_labels_fit(axis: &Axis, font: &FontRef<'static>, chart_w: u32) -> bool {
    let spans: Vec<(f64, f64)> = axis
        .major
        .iter()
        .map(|v| {
            let centre = axis.fraction(*v) * f64::from(chart_w);
            let half = f64::from(text::width(font, TICK_EM, &tick_label(*v))) / 2.0;
            (centre - half, centre + half)
        })
        .collect();
    spans
        .windows(2)
        .all(|w| w[1].0 - w[0].1 >= f64::from(X_LABEL_GAP))
}

/// A series name as the legend shows it: long names are cut.
fn legend_text(name: &str) -> String {
    if name.chars().count() > LEGEND_MAX_CHARS {
        let mut cut: String = name.chars().take(LEGEND_MAX_CHARS - 1).collect();
        cut.push('…');
        cut
    } else {
        name.to_string()
    }
}

// ---------------------------------------------------------------------------------------
// Drawing

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn render<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    fig: &Figure,
    plan: &Plan,
) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    put(
        root,
        plan,
        Label {
            text: &fig.title,
            at: (plan.width as i32 / 2, TITLE_H as i32 / 2 + 4),
            em: TITLE_EM,
            h: HPos::Center,
            v: VPos::Center,
            vertical: false,
        },
    )?;
    let (_, body) = root.split_vertically(TITLE_H);
    let (charts, legend_area) = body.split_horizontally(plan.width - plan.legend_w);
    if !fig.panels.is_empty() {
        let areas = charts.split_evenly((1, fig.panels.len()));
        for ((panel, (y_axis, widest)), area) in fig.panels.iter().zip(&plan.panels).zip(&areas) {
            draw_panel(root, area, fig, panel, plan, y_axis, *widest)?;
        }
    }
    draw_legend(root, &legend_area, plan)
}

fn put<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    plan: &Plan,
    label: Label,
) -> DrawResult<DB> {
    text::draw(root, plan.mode, plan.font, &label)
}

/// One tick of an axis: its mark, and the label of `value` anchored at `at`.
fn draw_tick<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    plan: &Plan,
    mark: [(i32, i32); 2],
    value: f64,
    at: (i32, i32),
    (h, v): (HPos, VPos),
) -> DrawResult<DB> {
    root.draw(&PathElement::new(mark.to_vec(), AXIS))?;
    let text = tick_label(value);
    let label = Label {
        text: &text,
        at,
        em: TICK_EM,
        h,
        v,
        vertical: false,
    };
    put(root, plan, label)
}

fn draw_panel<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    area: &DrawingArea<DB, Shift>,
    fig: &Figure,
    panel: &Panel,
    plan: &Plan,
    y_axis: &Axis,
    widest: u32,
) -> DrawResult<DB> {
    let x_axis = &plan.x_axis;
    let chart = ChartBuilder::on(area)
        .margin_top(MARGIN_TOP)
        .margin_right(MARGIN_RIGHT)
        .margin_left(MARGIN_LEFT)
        .margin_bottom(MARGIN_BOTTOM)
        .x_label_area_size(x_label_area())
        .y_label_area_size(y_label_area(widest))
        .build_cartesian_2d(x_axis.clone(), y_axis.clone())?;
    let plot = chart.plotting_area();
    let (left, bottom) = plot.map_coordinate(&(x_axis.lo, y_axis.lo));
    let (right, top) = plot.map_coordinate(&(x_axis.hi, y_axis.hi));
    let x_px = |v: f64| plot.map_coordinate(&(v, y_axis.lo)).0;
    let y_px = |v: f64| plot.map_coordinate(&(x_axis.lo, v)).1;

    // The grid, light lines first.
    for (ticks_x, ticks_y, color) in [
        (&x_axis.minor, &y_axis.minor, GRID_MINOR),
        (&x_axis.major, &y_axis.major, GRID_MAJOR),
    ] {
        for x in ticks_x.iter().map(|v| x_px(*v)) {
            root.draw(&PathElement::new(vec![(x, top), (x, bottom)], color))?;
        }
        for y in ticks_y.iter().map(|v| y_px(*v)) {
            root.draw(&PathElement::new(vec![(left, y), (right, y)], color))?;
        }
    }

    for series in &panel.series {
        let look = plan
            .looks
            .get(&series.name)
            .copied()
            .unwrap_or_else(|| Look::nth(0));
        let points = drawn_points(series);
        let at = |x: f64, y: f64| (x_axis.place(x), y_axis.place(y));
        let bar = ShapeStyle::from(&look.color).stroke_width(1);
        for p in &points {
            if let Some((lo, hi)) = p.bar {
                let (bottom, top) = (at(p.x, lo), at(p.x, hi));
                plot.draw(&PathElement::new(vec![bottom, top], bar))?;
                for end in [bottom, top] {
                    let cap = vec![(-CAP_HALF_W, 0), (CAP_HALF_W, 0)];
                    plot.draw(&(EmptyElement::at(end) + PathElement::new(cap, bar)))?;
                }
            }
        }
        if points.len() > 1 {
            plot.draw(&PathElement::new(
                points.iter().map(|p| at(p.x, p.y)).collect::<Vec<_>>(),
                ShapeStyle::from(&look.color).stroke_width(LINE_WIDTH),
            ))?;
        }
        for p in marked(&points) {
            with_marker!(at(p.x, p.y), look, |m| plot.draw(&m)?);
        }
    }

    // Axes over the data, then ticks and their labels.
    root.draw(&PathElement::new(
        vec![(left, top), (left, bottom), (right, bottom)],
        AXIS,
    ))?;
    for v in &x_axis.major {
        let x = x_px(*v);
        let mark = [(x, bottom), (x, bottom + TICK_LEN)];
        let at = (x, bottom + TICK_LEN + TICK_GAP);
        draw_tick(root, plan, mark, *v, at, (HPos::Center, VPos::Top))?;
    }
    for v in &y_axis.major {
        let y = y_px(*v);
        let mark = [(left - TICK_LEN, y), (left, y)];
        let at = (left - TICK_LEN - TICK_GAP, y);
        draw_tick(root, plan, mark, *v, at, (HPos::Right, VPos::Center))?;
    }
    put(
        root,
        plan,
        Label {
            text: &fig.x_label,
            at: (
                (left + right) / 2,
                bottom + TICK_LEN + TICK_GAP + text::line_height(TICK_EM) as i32 + DESC_GAP,
            ),
            em: DESC_EM,
            h: HPos::Center,
            v: VPos::Top,
            vertical: false,
        },
    )?;
    put(
        root,
        plan,
        Label {
            text: &panel.y_label,
            at: (
                left - TICK_LEN
                    - TICK_GAP
                    - widest as i32
                    - DESC_GAP
                    - text::line_height(DESC_EM) as i32,
                (top + bottom) / 2,
            ),
            em: DESC_EM,
            h: HPos::Center,
            v: VPos::Top,
            vertical: true,
        },
    )
}

fn draw_legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    area: &DrawingArea<DB, Shift>,
    plan: &Plan,
) -> DrawResult<DB> {
    let (x0, y0) = area.get_base_pixel();
    let top = y0 + MARGIN_TOP as i32;
    let row_h = LEGEND_ROW_H as i32;
    for (i, (name, look)) in plan.legend.iter().enumerate() {
        let y = top + row_h * i as i32 + row_h / 2;
        root.draw(&PathElement::new(
            vec![(x0 + 6, y), (x0 + 46, y)],
            ShapeStyle::from(&look.color).stroke_width(LINE_WIDTH),
        ))?;
        with_marker!((x0 + 26, y), *look, |m| root.draw(&m)?);
        let text = legend_text(name);
        put(
            root,
            plan,
            Label {
                text: &text,
                at: (x0 + LEGEND_SAMPLE_W as i32, y),
                em: LEGEND_EM,
                h: HPos::Left,
                v: VPos::Center,
                vertical: false,
            },
        )?;
    }
    Ok(())
}

/// A fresh file name in the directory of `path`, ending in `.png` (the encoder goes by the
/// extension).
fn temp_sibling(path: &Path) -> Result<PathBuf, String> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| "not a file path".to_string())?
        .to_string_lossy();
    let tmp = format!(
        ".{name}.{}-{}.tmp.png",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    Ok(path.with_file_name(tmp))
}

#[cfg(test)]
mod tests;
