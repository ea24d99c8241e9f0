//! Draws two example figures (PNG and SVG) into a directory.
//!
//! `cargo run -p qstore-plot --example demo -- OUT_DIR` (default: the system temp directory).

use qstore_plot::{draw_png, draw_svg, Figure, Panel, Point, Series};

const NAMES: [&str; 6] = [
    "qstore", "calvin", "hstore", "no_wait", "wait_die", "serial",
];

/// A point with a spread of `spread` (a fraction of y) around `y`.
fn point(x: f64, y: f64, spread: f64) -> Point {
    Point {
        x,
        y,
        lo: y * (1.0 - spread),
        hi: y * (1.0 + spread * 1.3),
    }
}

fn multi_partition() -> Figure {
    let xs = [0.0, 10.0, 20.0, 50.0, 80.0, 100.0];
    // Throughput at 0 % and how fast it falls with more multi-partition transactions.
    let shape = [
        (1.2e6, 0.5),
        (9.0e5, 0.8),
        (1.1e6, 4.0),
        (7.0e5, 2.0),
        (6.5e5, 1.6),
        (2.4e5, 0.1),
    ];
    let throughput = NAMES
        .iter()
        .zip(shape)
        .map(|(name, (top, fall))| Series {
            name: name.to_string(),
            points: xs
                .iter()
                .map(|x| point(*x, (top / (1.0 + fall * x / 100.0)).max(5.0e4), 0.06))
                .collect(),
        })
        .collect();
    let latency = NAMES
        .iter()
        .zip(shape)
        .map(|(name, (top, fall))| Series {
            name: name.to_string(),
            points: xs
                .iter()
                .map(|x| point(*x, 2.0e6 / top * (1.0 + fall * x / 60.0), 0.15))
                .collect(),
        })
        .collect();
    Figure {
        title: "Q-Store fig. 7: multi-partition transactions".to_string(),
        x_label: "multi-partition transactions (%)".to_string(),
        x_log: false,
        panels: vec![
            Panel {
                y_label: "throughput (txn/s)".to_string(),
                y_log: false,
                series: throughput,
            },
            Panel {
                y_label: "p99 latency (ms)".to_string(),
                y_log: false,
                series: latency,
            },
        ],
    }
}

fn batch_size() -> Figure {
    let xs = [1.0, 10.0, 100.0, 1000.0, 10000.0];
    let series = |f: &dyn Fn(usize, f64) -> f64, spread: f64| -> Vec<Series> {
        NAMES[..4]
            .iter()
            .enumerate()
            .map(|(i, name)| Series {
                name: name.to_string(),
                points: xs.iter().map(|x| point(*x, f(i, *x), spread)).collect(),
            })
            .collect()
    };
    Figure {
        title: "Batch size".to_string(),
        x_label: "batch size (transactions)".to_string(),
        x_log: true,
        panels: vec![
            Panel {
                y_label: "throughput (txn/s)".to_string(),
                y_log: false,
                series: series(
                    &|i, x| 1.2e6 / (1.0 + i as f64) * (x / (x + 30.0)).max(0.05),
                    0.05,
                ),
            },
            Panel {
                y_label: "median latency (ms)".to_string(),
                y_log: true,
                series: series(&|i, x| 0.2 * (1.0 + i as f64) + x / 500.0, 0.2),
            },
        ],
    }
}

fn main() {
    let dir = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    for (name, fig) in [("fig7", multi_partition()), ("batch", batch_size())] {
        for (ext, draw) in [
            ("png", draw_png as fn(&Figure, &std::path::Path) -> _),
            ("svg", draw_svg),
        ] {
            let path = dir.join(format!("{name}.{ext}"));
            match draw(&fig, &path) {
                Ok(()) => println!("{}", path.display()),
                Err(e) => {
                    eprintln!("{e}");
                    std::process::exit(1);
                }
            }
        }
    }
}
