//! Draws figures of every awkward shape to a temporary directory and checks the files.
//!
//! Set `QSTORE_PLOT_KEEP=1` to keep the images (the directory is printed) for a look.

use std::path::PathBuf;

use super::*;
use crate::axis::{linear_range, linear_ticks, log_range, log_ticks};

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// A fresh directory for one test.
fn out_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qstore-plot-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test directory");
    dir
}

/// Removes `dir` unless the images are to be kept.
fn done(dir: &Path) {
    if std::env::var_os("QSTORE_PLOT_KEEP").is_some() {
        eprintln!("images kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Draws `fig` as `stem.png` and `stem.svg` in `dir` and checks both files.
fn draw_both(fig: &Figure, dir: &Path, stem: &str) {
    let png = dir.join(format!("{stem}.png"));
    let svg = dir.join(format!("{stem}.svg"));
    draw_png(fig, &png).unwrap_or_else(|e| panic!("{e}"));
    draw_svg(fig, &svg).unwrap_or_else(|e| panic!("{e}"));
    let png_bytes = std::fs::read(&png).expect("read the PNG");
    assert!(
        png_bytes.len() > PNG_SIGNATURE.len(),
        "{} is empty",
        png.display()
    );
    assert!(
        png_bytes.starts_with(PNG_SIGNATURE),
        "{} is not a PNG",
        png.display()
    );
    let svg_text = std::fs::read_to_string(&svg).expect("read the SVG");
    assert!(!svg_text.is_empty(), "{} is empty", svg.display());
    assert!(
        svg_text.starts_with("<svg"),
        "{} is not an SVG",
        svg.display()
    );
    assert!(
        svg_text.contains(&fig.title),
        "{} lacks the title",
        svg.display()
    );
    // No temporary file is left behind.
    let left: Vec<_> = std::fs::read_dir(dir)
        .expect("list the test directory")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp."))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

fn point(x: f64, y: f64) -> Point {
    Point {
        x,
        y,
        lo: y * 0.9,
        hi: y * 1.2,
    }
}

fn series(name: &str, points: Vec<Point>) -> Series {
    Series {
        name: name.to_string(),
        points,
    }
}

fn panel(y_label: &str, y_log: bool, series: Vec<Series>) -> Panel {
    Panel {
        y_label: y_label.to_string(),
        y_log,
        series,
    }
}

fn figure(title: &str, x_log: bool, panels: Vec<Panel>) -> Figure {
    Figure {
        title: title.to_string(),
        x_label: "batch size".to_string(),
        x_log,
        panels,
    }
}

#[test]
fn two_panels_log_x_and_log_y() {
    let dir = out_dir("two-panels");
    let xs = [1.0, 10.0, 100.0, 1000.0, 10000.0];
    let names = [
        "qstore", "calvin", "hstore", "no_wait", "wait_die", "serial",
    ];
    let throughput: Vec<Series> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let pts = xs
                .iter()
                .map(|x| point(*x, 1.2e6 / (i + 1) as f64 * x / (x + 50.0)))
                .collect();
            series(n, pts)
        })
        .collect();
    let latency: Vec<Series> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let pts = xs
                .iter()
                .map(|x| point(*x, 0.3 * (i + 1) as f64 + x / 400.0))
                .collect();
            series(n, pts)
        })
        .collect();
    for x_log in [true, false] {
        let fig = figure(
            "Throughput and latency by batch size",
            x_log,
            vec![
                panel("throughput (txn/s)", false, throughput.clone()),
                panel("p99 latency (ms)", true, latency.clone()),
            ],
        );
        draw_both(&fig, &dir, &format!("two-panels-xlog-{x_log}"));
    }
    done(&dir);
}

#[test]
fn empty_series_and_empty_panel() {
    let dir = out_dir("empty");
    let fig = figure(
        "Empty series",
        false,
        vec![
            panel(
                "throughput (txn/s)",
                false,
                vec![
                    series("empty", vec![]),
                    series("full", vec![point(1.0, 5.0), point(2.0, 7.0)]),
                ],
            ),
            panel("nothing at all", true, vec![]),
            panel("only empty", false, vec![series("empty", vec![])]),
        ],
    );
    draw_both(&fig, &dir, "empty");
    // Every panel and series empty, on log and linear axes.
    for x_log in [false, true] {
        let fig = figure(
            "Nothing to show",
            x_log,
            vec![
                panel("y", true, vec![series("empty", vec![])]),
                panel("y", false, vec![]),
            ],
        );
        draw_both(&fig, &dir, &format!("nothing-xlog-{x_log}"));
    }
    draw_both(&figure("No panels", false, vec![]), &dir, "no-panels");
    done(&dir);
}

#[test]
fn single_x_value() {
    let dir = out_dir("single-x");
    for (x_log, x) in [(false, 0.0), (false, 42.0), (true, 100.0)] {
        let fig = figure(
            "One x value",
            x_log,
            vec![
                panel(
                    "throughput (txn/s)",
                    false,
                    vec![
                        series("a", vec![point(x, 5.0e5)]),
                        series("b", vec![point(x, 2.0e5)]),
                    ],
                ),
                panel("latency (ms)", true, vec![series("a", vec![point(x, 3.0)])]),
            ],
        );
        draw_both(&fig, &dir, &format!("single-{x_log}-{x}"));
    }
    done(&dir);
}

#[test]
fn zero_and_negative_values_on_log_axes() {
    let dir = out_dir("log-nonpositive");
    let pts = vec![
        Point {
            x: 0.0,
            y: 0.0,
            lo: -1.0,
            hi: 2.0,
        },
        Point {
            x: -5.0,
            y: 3.0,
            lo: 1.0,
            hi: 4.0,
        },
        point(10.0, 50.0),
        point(100.0, 500.0),
        Point {
            x: 1000.0,
            y: -7.0,
            lo: -8.0,
            hi: -6.0,
        },
    ];
    let fig = figure(
        "Zero and negative values on log axes",
        true,
        vec![
            panel("log y", true, vec![series("mixed", pts.clone())]),
            panel("linear y", false, vec![series("mixed", pts)]),
        ],
    );
    draw_both(&fig, &dir, "mixed");
    // Nothing positive at all on a log axis.
    let fig = figure(
        "Nothing positive",
        true,
        vec![panel(
            "log y",
            true,
            vec![series("zeros", vec![point(0.0, 0.0), point(-1.0, -3.0)])],
        )],
    );
    draw_both(&fig, &dir, "nothing-positive");
    done(&dir);
}

#[test]
fn non_finite_values_are_skipped() {
    let dir = out_dir("non-finite");
    let pts = vec![
        point(1.0, 10.0),
        point(2.0, f64::NAN),
        point(3.0, f64::INFINITY),
        point(f64::NAN, 5.0),
        Point {
            x: 4.0,
            y: 12.0,
            lo: f64::NAN,
            hi: f64::INFINITY,
        },
        // Spread on the wrong side of y, and an unsorted x.
        Point {
            x: 0.5,
            y: 8.0,
            lo: 9.0,
            hi: 7.0,
        },
    ];
    let fig = figure(
        "Non-finite points",
        false,
        vec![
            panel("linear", false, vec![series("s", pts.clone())]),
            panel("log", true, vec![series("s", pts)]),
        ],
    );
    draw_both(&fig, &dir, "non-finite");
    done(&dir);
}

#[test]
fn extreme_values() {
    let dir = out_dir("extreme");
    let cases: [&[f64]; 5] = [
        &[1e300, 2e300],
        &[1e-300, 1e-299],
        &[-1e308, 1e308],
        &[1e15, 1e15 + 1.0],
        &[f64::MIN_POSITIVE, f64::MAX],
    ];
    for (i, values) in cases.iter().enumerate() {
        let pts: Vec<Point> = values
            .iter()
            .map(|v| Point {
                x: *v,
                y: *v,
                lo: *v,
                hi: *v,
            })
            .collect();
        for x_log in [false, true] {
            let fig = figure(
                "Extreme values",
                x_log,
                vec![
                    panel("linear", false, vec![series("s", pts.clone())]),
                    panel("log", true, vec![series("s", pts.clone())]),
                ],
            );
            draw_both(&fig, &dir, &format!("extreme-{i}-{x_log}"));
        }
    }
    done(&dir);
}

#[test]
fn svg_text_is_escaped() {
    let dir = out_dir("escape");
    let fig = figure(
        "a < b & c",
        false,
        vec![panel(
            "y",
            false,
            vec![series("<s>", vec![point(1.0, 1.0)])],
        )],
    );
    let path = dir.join("escape.svg");
    draw_svg(&fig, &path).unwrap_or_else(|e| panic!("{e}"));
    let svg = std::fs::read_to_string(&path).expect("read the SVG");
    assert!(svg.contains("a &lt; b &amp; c"), "{svg}");
    assert!(svg.contains("&lt;s&gt;") || svg.contains("&lt;s>"), "{svg}");
    done(&dir);
}

#[test]
fn many_series_and_long_names() {
    let dir = out_dir("many");
    let all: Vec<Series> = (0..14)
        .map(|i| {
            let name = if i == 3 {
                "a very long series name that the legend has to cut short somewhere".to_string()
            } else {
                format!("series {i}")
            };
            let pts = (0..6)
                .map(|x| point(f64::from(x), f64::from((i + 1) * (x + 1))))
                .collect();
            Series { name, points: pts }
        })
        .collect();
    let fig = figure("Fourteen series", false, vec![panel("value", false, all)]);
    draw_both(&fig, &dir, "many");
    done(&dir);
}

#[test]
fn any_extension_and_overwrite() {
    let dir = out_dir("extension");
    let fig = figure(
        "Any file name",
        false,
        vec![panel("y", false, vec![series("s", vec![point(1.0, 1.0)])])],
    );
    let path = dir.join("figure.image");
    draw_png(&fig, &path).unwrap_or_else(|e| panic!("{e}"));
    draw_png(&fig, &path).unwrap_or_else(|e| panic!("{e}"));
    let bytes = std::fs::read(&path).expect("read the image");
    assert!(bytes.starts_with(PNG_SIGNATURE));
    done(&dir);
}

#[test]
fn unwritable_path_is_an_error_naming_it() {
    let dir = out_dir("unwritable");
    let fig = figure("Nowhere", false, vec![panel("y", false, vec![])]);
    let missing = dir.join("no such directory");
    for (path, draw) in [
        (
            missing.join("f.png"),
            draw_png as fn(&Figure, &Path) -> Result<(), String>,
        ),
        (missing.join("f.svg"), draw_svg),
    ] {
        let err = draw(&fig, &path).expect_err("drawing into a missing directory");
        assert!(err.contains(&path.display().to_string()), "{err}");
    }
    assert!(draw_png(&fig, Path::new("/")).is_err());
    done(&dir);
}

#[test]
fn dense_lines_mark_a_dozen_points() {
    let few: Vec<usize> = (0..DENSE).collect();
    assert_eq!(marked(&few).count(), DENSE);
    let cdf: Vec<usize> = (0..103).collect();
    let marks: Vec<usize> = marked(&cdf).copied().collect();
    assert_eq!(marks, [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 102]);
    assert_eq!(marked::<usize>(&[]).count(), 0);
    // A distribution: latency on a log x axis, the fraction on y.
    let line = |name: &str, scale: f64| {
        let points = (1..=103)
            .map(|i| {
                let y = f64::from(i) / 103.0;
                let x = scale * (1.0 + 50.0 * y.powi(8));
                Point { x, y, lo: y, hi: y }
            })
            .collect();
        series(name, points)
    };
    let dir = out_dir("dense");
    let fig = figure(
        "Latency CDF",
        true,
        vec![panel(
            "fraction",
            false,
            vec![line("a", 0.5), line("b", 1.0)],
        )],
    );
    draw_both(&fig, &dir, "cdf");
    done(&dir);
}

#[test]
fn same_name_same_look() {
    let a = series("a", vec![point(1.0, 1.0)]);
    let b = series("b", vec![point(1.0, 1.0)]);
    let fig = figure(
        "Looks",
        false,
        vec![
            panel("1", false, vec![a.clone(), b.clone()]),
            panel("2", false, vec![b, a]),
        ],
    );
    let plan = Plan::new(&fig, Mode::Raster).expect("plan");
    assert_eq!(plan.legend.len(), 2);
    assert_eq!(plan.legend[0].0, "a");
    assert_eq!(plan.legend[1].0, "b");
    assert_ne!(plan.legend[0].1.color, plan.legend[1].1.color);
    assert_ne!(plan.legend[0].1.shape, plan.legend[1].1.shape);
}

#[test]
fn tick_labels_are_short() {
    let cases = [
        (0.0, "0"),
        (5.0, "5"),
        (100.0, "100"),
        (0.5, "0.5"),
        (2.5, "2.5"),
        (12.5, "12.5"),
        (0.25, "0.25"),
        (0.3000000000000004, "0.3"),
        (1000.0, "1k"),
        (10000.0, "10k"),
        (250000.0, "250k"),
        (1.2e6, "1.2M"),
        (1.25e6, "1.25M"),
        (1.0e6, "1M"),
        (3.0e9, "3G"),
        (-2000.0, "-2k"),
        (-0.0, "0"),
        (1e-300, "1e-300"),
        (2.5e-7, "2.5e-7"),
        (1.5e15, "1.5e15"),
        (-3e20, "-3e20"),
    ];
    for (v, want) in cases {
        assert_eq!(tick_label(v), want, "label of {v}");
    }
}

#[test]
fn ranges_and_ticks() {
    // Linear y starts at 0 and has a margin above.
    let (lo, hi) = linear_range(&[5.0e4, 1.2e6], true);
    assert_eq!(lo, 0.0);
    assert!(hi > 1.2e6);
    let (major, _) = linear_ticks(lo, hi, 9);
    assert!(major.len() >= 4 && major.len() <= 9, "{major:?}");
    assert_eq!(major[0], 0.0);
    // One value gets a range around it.
    let (lo, hi) = linear_range(&[42.0], false);
    assert!(lo < 42.0 && hi > 42.0);
    let (lo, hi) = linear_range(&[], true);
    assert!(lo < hi);
    // Log ranges clamp non-positive values to half the smallest positive one.
    let (lo, hi, floor) = log_range(&[0.0, -3.0, 4.0, 400.0]);
    assert_eq!(floor, 2.0);
    assert!(lo <= 2.0 && hi >= 400.0);
    let (lo, hi, _) = log_range(&[-1.0]);
    assert!(lo > 0.0 && hi > lo);
    // Decades over a wide range, 1-2-5 over a short one.
    let (lo, hi, _) = log_range(&[1.0, 10000.0]);
    let (major, _) = log_ticks(lo, hi, 11);
    assert_eq!(major, vec![1.0, 10.0, 100.0, 1000.0, 10000.0]);
    let (major, _) = log_ticks(0.15, 25.0, 9);
    assert_eq!(major, vec![0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0]);
    // Many decades are thinned.
    let (major, _) = log_ticks(1e-3, 1e12, 6);
    assert!(major.len() <= 6, "{major:?}");
    // Too short for powers of ten.
    let (major, _) = log_ticks(300.0, 350.0, 9);
    assert!(major.len() >= 2, "{major:?}");
}
