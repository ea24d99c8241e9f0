//! Text: the embedded font, measuring, and drawing with exact glyph placement.
//!
//! In PNG images every glyph is rasterised here (at its exact advance, with kerning) and
//! blended into the image pixel by pixel. SVG images get `<text>` elements, laid out by the
//! viewer.

use std::sync::OnceLock;

use ab_glyph::{point, Font, FontRef, GlyphId, PxScale, ScaleFont};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontTransform;

/// The family every text of a figure uses; DejaVu Sans is registered under it.
const FAMILY: &str = "sans-serif";
/// DejaVu Sans (Bitstream Vera licence, see `assets/DejaVuSans-LICENSE.txt`).
const FONT_DATA: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
/// The height of capital letters and digits in DejaVu Sans, in em.
const CAP_HEIGHT: f64 = 1493.0 / 2048.0;
/// How far descenders reach below the baseline in DejaVu Sans, in em.
const DESCENT: f64 = 483.0 / 2048.0;
/// The SVG backend writes a font size of 1/1.24 of the one it is given.
const SVG_SIZE_FACTOR: f64 = 1.24;
/// Where the SVG backend puts the baseline below the anchor of top-aligned text, in em.
const SVG_TOP_BASELINE: f64 = 0.76;

/// The embedded font, parsed once, and registered once with plotters (for the SVG backend).
pub(crate) fn font() -> Result<&'static FontRef<'static>, String> {
    static FONT: OnceLock<Result<FontRef<'static>, String>> = OnceLock::new();
    FONT.get_or_init(|| {
        plotters::style::register_font(FAMILY, FontStyle::Normal, FONT_DATA)
            .map_err(|_| "the embedded font cannot be registered".to_string())?;
        FontRef::try_from_slice(FONT_DATA).map_err(|e| format!("the embedded font: {e}"))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// How text is put on an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Glyphs rasterised here, pixel by pixel.
    Raster,
    /// `<text>` elements.
    Svg,
}

/// The scale that makes glyphs `em` pixels to the em (ab_glyph scales to the font's height).
fn px_scale(font: &FontRef<'static>, em: f64) -> PxScale {
    let units_per_em = font.units_per_em().unwrap_or(2048.0);
    PxScale::from(em as f32 * font.height_unscaled() / units_per_em)
}

/// The glyphs of `text` with their pen positions, and the advance of the whole text.
fn layout(font: &FontRef<'static>, em: f64, text: &str) -> (Vec<(GlyphId, f32)>, f32) {
    let scaled = font.as_scaled(px_scale(font, em));
    let mut pen = 0.0;
    let mut prev: Option<GlyphId> = None;
    let mut glyphs = Vec::with_capacity(text.len());
    for c in text.chars() {
        let id = scaled.glyph_id(c);
        if let Some(p) = prev {
            pen += scaled.kern(p, id);
        }
        glyphs.push((id, pen));
        pen += scaled.h_advance(id);
        prev = Some(id);
    }
    (glyphs, pen)
}

/// The width in pixels of `text` at `em` pixels to the em.
pub(crate) fn width(font: &FontRef<'static>, em: f64, text: &str) -> u32 {
    layout(font, em, text).1.ceil().max(0.0) as u32
}

/// The height in pixels of a line of text (capitals to descenders).
pub(crate) fn line_height(em: f64) -> u32 {
    (em * (CAP_HEIGHT + DESCENT)).ceil() as u32
}

/// One text to draw.
pub(crate) struct Label<'t> {
    pub text: &'t str,
    /// The anchor, in image pixels.
    pub at: (i32, i32),
    /// Pixels to the em.
    pub em: f64,
    /// Which part of the text is at the anchor along the line.
    pub h: HPos,
    /// Which part is at the anchor across it: the top of capitals, their middle, or the
    /// bottom of descenders.
    pub v: VPos,
    /// Reads bottom to top (a y axis label).
    pub vertical: bool,
}

/// The baseline's distance below the anchor, in pixels.
fn baseline(v: VPos, em: f64) -> f64 {
    match v {
        VPos::Top => CAP_HEIGHT * em,
        VPos::Center => CAP_HEIGHT * em / 2.0,
        VPos::Bottom => -DESCENT * em,
    }
}

/// Draws `label` on `root`.
pub(crate) fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    mode: Mode,
    font: &FontRef<'static>,
    label: &Label,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    // Text-frame offsets (x along the line, y down across it) to image offsets.
    let turn = |x: i32, y: i32| if label.vertical { (y, -x) } else { (x, y) };
    let (ax, ay) = label.at;
    let base = baseline(label.v, label.em);
    match mode {
        Mode::Svg => {
            let (dx, dy) = turn(0, (base - SVG_TOP_BASELINE * label.em).round() as i32);
            let style = TextStyle::from((FAMILY, label.em * SVG_SIZE_FACTOR).into_font())
                .color(&BLACK)
                .pos(Pos::new(label.h, VPos::Top))
                .transform(if label.vertical {
                    FontTransform::Rotate270
                } else {
                    FontTransform::None
                });
            root.draw(&Text::new(
                label.text.to_string(),
                (ax + dx, ay + dy),
                style,
            ))
        }
        Mode::Raster => {
            let (glyphs, advance) = layout(font, label.em, label.text);
            let start = match label.h {
                HPos::Left => 0.0,
                HPos::Center => -advance / 2.0,
                HPos::Right => -advance,
            };
            let scale = px_scale(font, label.em);
            let base = base.round() as f32;
            let mut pixels = Vec::new();
            for (id, pen) in glyphs {
                let glyph = id.with_scale_and_position(scale, point(start + pen, base));
                if let Some(outline) = font.outline_glyph(glyph) {
                    let bounds = outline.px_bounds();
                    let (x0, y0) = (bounds.min.x as i32, bounds.min.y as i32);
                    outline.draw(|x, y, coverage| {
                        if coverage > 0.0 {
                            pixels.push((turn(x0 + x as i32, y0 + y as i32), coverage));
                        }
                    });
                }
            }
            for ((dx, dy), coverage) in pixels {
                root.draw_pixel((ax + dx, ay + dy), &BLACK.mix(f64::from(coverage.min(1.0))))?;
            }
            Ok(())
        }
    }
}
