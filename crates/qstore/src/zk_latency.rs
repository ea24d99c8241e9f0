//! `qstore zookeeper-latency`: QR-Store's figure 4, the latency of a replication middleware
//! by payload size. Writes `--requests` znodes of each payload size to a ZooKeeper server,
//! `--concurrency` at once, and reports each size's write latencies as a table, CSV and a
//! plot (PNG and SVG).

use clap::Args;
use qstore_engine::replication::zookeeper::{write_latencies, MAX_ZNODE};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct ZkLatencyArgs {
    /// The ZooKeeper server's client address (start one: scripts/zookeeper.sh start 2181 DIR).
    #[arg(long, default_value = "127.0.0.1:2181", value_name = "HOST:PORT")]
    zookeeper: String,
    /// Writes per payload size.
    #[arg(long, default_value_t = 100)]
    requests: usize,
    /// Writes in flight at once (the paper: 100).
    #[arg(long, default_value_t = 100)]
    concurrency: usize,
    /// Payload sizes in bytes, comma-separated (the paper: 100 B to 800 KB).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "100,1000,10000,100000,200000,400000,800000"
    )]
    payloads: Vec<usize>,
    /// Where to write results.csv, figure.png and figure.svg.
    #[arg(long, default_value = "figures/qrstore-fig4")]
    out: PathBuf,
}

/// One payload size's latencies, in milliseconds.
struct Row {
    payload: usize,
    mean: f64,
    p50: f64,
    p99: f64,
    max: f64,
}

pub fn zookeeper_latency(args: ZkLatencyArgs) -> i32 {
    if let Err(e) = check(&args) {
        eprintln!("error: {e}");
        return 2;
    }
    if !qstore_engine::replication::zookeeper::answers(&args.zookeeper) {
        eprintln!(
            "error: no ZooKeeper server answers at {}: start one with \
             scripts/zookeeper.sh start PORT DIR, or name it with --zookeeper",
            args.zookeeper
        );
        return 1;
    }
    let path = format!("/qstore/latency-{}", std::process::id());
    // A round of the first size, not measured: a fresh server's first writes also pay for
    // its warm-up (class loading, compilation).
    let first = args.payloads[0];
    if let Err(e) = write_latencies(
        &args.zookeeper,
        &path,
        first,
        args.requests,
        args.concurrency,
    ) {
        eprintln!("error: warming up with {first} bytes: {e}");
        return 1;
    }
    let mut rows = Vec::new();
    for &payload in &args.payloads {
        eprintln!(
            "writing {} znodes of {payload} bytes, {} at once...",
            args.requests, args.concurrency
        );
        match write_latencies(
            &args.zookeeper,
            &path,
            payload,
            args.requests,
            args.concurrency,
        ) {
            Ok(l) => rows.push(summarise(payload, l)),
            Err(e) => {
                eprintln!("error: {payload} bytes: {e}");
                return 1;
            }
        }
    }
    print_table(&rows);
    match write_outputs(&args.out, &rows) {
        Ok(()) => {
            println!("wrote {}", args.out.display());
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn check(args: &ZkLatencyArgs) -> Result<(), String> {
    if args.requests == 0 || args.concurrency == 0 {
        return Err("--requests and --concurrency must be at least 1".into());
    }
    match args.payloads.iter().find(|&&p| p == 0 || p > MAX_ZNODE) {
        Some(p) => Err(format!(
            "invalid payload size {p}: ZooKeeper keeps at most {MAX_ZNODE} bytes in a znode"
        )),
        None if args.payloads.is_empty() => Err("--payloads names no size".into()),
        None => Ok(()),
    }
}

fn summarise(payload: usize, mut latencies: Vec<Duration>) -> Row {
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let at = |q: f64| ms(latencies[((latencies.len() - 1) as f64 * q).round() as usize]);
    let mean = latencies.iter().map(|&d| ms(d)).sum::<f64>() / latencies.len() as f64;
    Row {
        payload,
        mean,
        p50: at(0.5),
        p99: at(0.99),
        max: at(1.0),
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "{:>12}  {:>9}  {:>9}  {:>9}  {:>9}",
        "payload (B)", "mean ms", "p50 ms", "p99 ms", "max ms"
    );
    for r in rows {
        println!(
            "{:>12}  {:>9.2}  {:>9.2}  {:>9.2}  {:>9.2}",
            r.payload, r.mean, r.p50, r.p99, r.max
        );
    }
}

fn write_outputs(out: &std::path::Path, rows: &[Row]) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let csv_path = out.join("results.csv");
    let mut csv = String::from("payload_bytes,mean_ms,p50_ms,p99_ms,max_ms\n");
    for r in rows {
        let line = format!("{},{},{},{},{}\n", r.payload, r.mean, r.p50, r.p99, r.max);
        csv.push_str(&line);
    }
    std::fs::write(&csv_path, csv)
        .map_err(|e| format!("cannot write {}: {e}", csv_path.display()))?;
    let fig = qstore_plot::Figure {
        title: "QR-Store figure 4: ZooKeeper write latency by payload".into(),
        x_label: "payload (bytes)".into(),
        x_log: true,
        panels: vec![qstore_plot::Panel {
            y_label: "latency (ms)".into(),
            y_log: false,
            series: vec![qstore_plot::Series {
                name: "ZooKeeper (median, p50..p99)".into(),
                points: rows
                    .iter()
                    .map(|r| qstore_plot::Point {
                        x: r.payload as f64,
                        y: r.p50,
                        lo: r.p50,
                        hi: r.p99,
                    })
                    .collect(),
            }],
        }],
    };
    qstore_plot::draw_png(&fig, &out.join("figure.png"))?;
    qstore_plot::draw_svg(&fig, &out.join("figure.svg"))
}
