//! `qstore figure` end to end: a tiny two-point spec swept, interrupted, resumed and drawn.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const SPEC: &str = r#"
paper = "Test paper"
figure = "Figure 1"
title = "skew"
claim = "qstore commits transactions at both skews."

[base]
cluster = { nodes = 1, workers = 1 }
workload.name = "ycsb"
workload.ycsb = { records_per_partition = 2000, ops_per_txn = 4 }
client = { duration_s = 1.0, warmup_s = 0.0, inflight = 16 }

[x]
label = "theta"
param = "workload.ycsb.theta"
values = [0.0, 0.5]

[[metric]]
name = "throughput_tps"

[[metric]]
name = "latency_p99_ms"
log = true

[[series]]
protocol = "qstore"

[[series]]
protocol = "no-such-protocol"
name = "future"

[[trend]]
kind = "flat"
series = "qstore"
within = 0.99

[quick]
base.client.duration_s = 0.3
"#;

fn qstore() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qstore"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qstore-figure-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(args: &[&str]) -> Output {
    qstore().args(args).output().expect("run qstore")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Data rows of a CSV file.
/// Draws the figure of `spec` into `out`, which must succeed with every trend holding; its
/// standard output.
fn draw_holding(spec: &Path, out: &Path) -> String {
    let o = run(&[
        "figure",
        spec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("verdict: holds"), "{stdout}");
    stdout
}

fn rows(path: &Path) -> Vec<Vec<String>> {
    let mut r = csv::Reader::from_path(path).unwrap();
    r.records()
        .map(|rec| rec.unwrap().iter().map(String::from).collect())
        .collect()
}

fn header(path: &Path) -> Vec<String> {
    let mut r = csv::Reader::from_path(path).unwrap();
    r.headers().unwrap().iter().map(String::from).collect()
}

#[test]
fn a_two_point_sweep_survives_a_kill_resumes_and_draws_its_figure() {
    let dir = scratch("resume");
    let spec = dir.join("tiny.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let out = dir.join("out");
    let results = out.join("results.csv");
    let (spec_arg, out_arg) = (spec.to_str().unwrap(), out.to_str().unwrap());

    // Kill the sweep while its second run is under way.
    let mut child = qstore()
        .args(["figure", spec_arg, "--out", out_arg])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !results.exists() || rows(&results).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(60), "no run finished");
        assert!(child.try_wait().unwrap().is_none(), "the sweep ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(rows(&results).len(), 1, "killed after exactly one run");

    let o = run(&["figure", spec_arg, "--out", out_arg]);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("resuming: 1 of 2 runs already in results.csv"),
        "{stderr}"
    );
    assert!(stdout.contains("not drawn: future"), "{stdout}");
    assert!(
        stdout.contains("holds: throughput_tps: qstore varies"),
        "{stdout}"
    );
    assert!(stdout.contains("verdict: holds"), "{stdout}");

    // One row per run: every parameter the spec sets, every metric, the round.
    let h = header(&results);
    for column in [
        "round",
        "series",
        "x",
        "failure",
        "protocol.name",
        "workload.ycsb.theta",
        "workload.ycsb.records_per_partition",
        "client.duration_s",
        "throughput_tps",
        "latency_p99_ms",
        "abort_rate_pct",
        "msgs_per_txn",
    ] {
        assert!(h.iter().any(|c| c == column), "{column} missing from {h:?}");
    }
    let data = rows(&results);
    assert_eq!(data.len(), 2);
    let col = |name: &str| h.iter().position(|c| c == name).unwrap();
    let mut thetas: Vec<&str> = data
        .iter()
        .map(|r| r[col("workload.ycsb.theta")].as_str())
        .collect();
    thetas.sort_unstable();
    assert_eq!(thetas, ["0.0", "0.5"]);
    for r in &data {
        assert_eq!(r[col("series")], "qstore");
        assert_eq!(r[col("failure")], "");
        assert!(r[col("throughput_tps")].parse::<f64>().unwrap() > 0.0);
    }

    let summary = out.join("summary.csv");
    let sh = header(&summary);
    assert_eq!(sh[..4], ["series", "x", "runs", "failed"]);
    assert!(sh.iter().any(|c| c == "throughput_tps_median"));
    assert_eq!(rows(&summary).len(), 2);

    let png = std::fs::read(out.join("figure.png")).unwrap();
    assert!(
        png.len() > 1000 && png.starts_with(b"\x89PNG"),
        "{} bytes",
        png.len()
    );
    let svg = std::fs::read_to_string(out.join("figure.svg")).unwrap();
    assert!(
        svg.contains("<svg") && svg.contains("skew"),
        "{} bytes",
        svg.len()
    );

    // The same directory with --quick is another sweep: refused, nothing mixed in.
    let o = run(&["figure", spec_arg, "--out", out_arg, "--quick"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("holds the results of another sweep"));
    assert_eq!(rows(&results).len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_spec_or_name_is_refused_with_exit_2() {
    let dir = scratch("bad");
    let cases: &[(&str, &str)] = &[
        ("[x]\nlabel = 1\n", "spec broken"),
        (
            &SPEC.replace("throughput_tps\"", "speed\""),
            "unknown metric \"speed\"",
        ),
        (
            &SPEC.replace("values = [0.0, 0.5]", "values = [0.0, 7000.0]"),
            "workload.ycsb.theta = 7000",
        ),
        (
            &SPEC.replace("workload.ycsb.theta", "workload.ycsb.thetaa"),
            "unknown field `thetaa`",
        ),
        (
            &SPEC.replace("series = \"qstore\"\nwithin", "series = \"calvin\"\nwithin"),
            "a trend names series \"calvin\"",
        ),
    ];
    for (i, (text_, expect)) in cases.iter().enumerate() {
        let spec = dir.join("broken.toml");
        std::fs::write(&spec, text_).unwrap();
        let o = run(&[
            "figure",
            spec.to_str().unwrap(),
            "--out",
            dir.join(format!("o{i}")).to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2), "case {i}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains(expect),
            "case {i}: {}",
            text(&o.stderr)
        );
    }
    let o = run(&["figure", "no-such-figure"]);
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(err.contains("choose one of: "), "{err}");
    for name in ["qstore-fig5", "qrstore-fig6", "sundial-fig7"] {
        assert!(err.contains(name), "{name} missing: {err}");
    }
    // A spec that needs what this build lacks is refused before anything runs.
    let needy = dir.join("needy.toml");
    std::fs::write(&needy, format!("needs = [\"no-such-workload\"]\n{SPEC}")).unwrap();
    let o = run(&["figure", needy.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("needs no-such-workload"),
        "{}",
        text(&o.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_list_names_every_spec_and_what_it_lacks() {
    let o = run(&["figure", "--list"]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    for fig in [5, 6, 7, 8, 9, 10, 11, 12, 13] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("qstore-fig{fig} ")))
            .unwrap_or_else(|| panic!("fig {fig} missing: {out}"));
        assert!(line.contains("ready"), "{line}");
    }
    for fig in [7, 8, 9, 10, 11, 12, 13] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("sundial-fig{fig} ")))
            .unwrap_or_else(|| panic!("sundial fig {fig} missing: {out}"));
        assert!(line.contains("ready"), "{line}");
    }
    let fig5 = out.find("qstore-fig5 ").unwrap();
    assert!(
        fig5 < out.find("qstore-fig10 ").unwrap(),
        "figure 5 lists before 10"
    );
    // A spec with a series whose protocol this build lacks names it.
    let dir = scratch("list");
    std::fs::write(dir.join("test-fig1.toml"), SPEC).unwrap();
    let o = run(&["figure", "--list", "--specs", dir.to_str().unwrap()]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("not built yet: no-such-protocol"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_over_time_figure_draws_each_series_second_by_second() {
    let dir = scratch("over-time");
    let spec = dir.join("timeline.toml");
    std::fs::write(
        &spec,
        r#"
paper = "Test paper"
figure = "Figure 2"
title = "over time"
claim = "Throughput is drawn second by second."

[base]
cluster = { nodes = 2, workers = 1 }
workload.ycsb = { records_per_partition = 2000, ops_per_txn = 4, remote_access_fraction = 0.1 }
client = { duration_s = 2.5, warmup_s = 0.0, inflight = 4 }

[x]
label = "time (s)"
over_time = true

[[metric]]
name = "throughput_tps"

[[metric]]
name = "bytes_per_s"

[[series]]
protocol = "lstore"

[[series]]
protocol = "hstore"

[[trend]]
kind = "ratio"
series = "lstore"
over = "hstore"
at_least = 0.0
"#,
    )
    .unwrap();
    let out = dir.join("out");
    draw_holding(&spec, &out);

    // Three rows per series (seconds 1 and 2, and the last half second), each with the
    // second as its x and the timeline's metrics; the rest are not measured per second.
    let results = out.join("results.csv");
    let h = header(&results);
    let col = |name: &str| h.iter().position(|c| c == name).unwrap();
    let data = rows(&results);
    for series in ["lstore", "hstore"] {
        let mine: Vec<_> = data.iter().filter(|r| r[col("series")] == series).collect();
        let xs: Vec<f64> = mine.iter().map(|r| r[col("x")].parse().unwrap()).collect();
        assert_eq!(xs, [1.0, 2.0, 2.5], "{series}: {mine:?}");
        for r in &mine {
            assert!(
                r[col("throughput_tps")].parse::<f64>().unwrap() > 0.0,
                "{r:?}"
            );
            assert!(r[col("bytes_per_s")].parse::<f64>().unwrap() > 0.0, "{r:?}");
            assert_eq!(r[col("latency_p99_ms")], "NaN", "{r:?}");
        }
    }
    assert_eq!(rows(&out.join("summary.csv")).len(), 6);
    assert!(std::fs::read(out.join("figure.png")).unwrap().len() > 1000);

    // A run metric that has no per-second value cannot be drawn over time.
    let bad = std::fs::read_to_string(&spec)
        .unwrap()
        .replace("bytes_per_s", "latency_p99_ms");
    std::fs::write(&spec, bad).unwrap();
    let o = run(&[
        "figure",
        spec.to_str().unwrap(),
        "--out",
        dir.join("bad").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("is not measured second by second"),
        "{}",
        text(&o.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cdf_figure_draws_each_series_latency_distribution() {
    let dir = scratch("cdf");
    let spec = dir.join("latency.toml");
    std::fs::write(
        &spec,
        r#"
paper = "Test paper"
figure = "Figure 7"
title = "latency CDF"
claim = "Latency is drawn as a distribution."
repeats = 2

[base]
cluster = { nodes = 2, workers = 1 }
workload.ycsb = { records_per_partition = 2000, ops_per_txn = 4 }
client = { duration_s = 0.5, warmup_s = 0.0, rate = 500.0 }

[x]
label = "latency (ms)"
cdf = true

[[series]]
protocol = "qstore"

[[series]]
protocol = "no_wait"

[[trend]]
kind = "ratio"
series = "qstore"
over = "no_wait"
metric = "latency_p50_ms"
at_least = 0.0
"#,
    )
    .unwrap();
    let out = dir.join("out");
    let stdout = draw_holding(&spec, &out);
    assert!(stdout.contains("latency (ms) by percentile"), "{stdout}");

    // One row per run in results.csv; each run's CDF in cdf-runs.csv; one curve per series,
    // nondecreasing and ending at 1, in cdf.csv.
    assert_eq!(rows(&out.join("results.csv")).len(), 4);
    assert_eq!(rows(&out.join("cdf-runs.csv")).len(), 4 * 103);
    assert_eq!(
        header(&out.join("cdf.csv")),
        ["series", "latency_ms", "fraction"]
    );
    let curves = rows(&out.join("cdf.csv"));
    for series in ["qstore", "no_wait"] {
        let curve: Vec<(f64, f64)> = curves
            .iter()
            .filter(|r| r[0] == series)
            .map(|r| (r[1].parse().unwrap(), r[2].parse().unwrap()))
            .collect();
        assert_eq!(curve.len(), 103, "{series}");
        assert!(curve
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
        assert!(
            curve[0].0 > 0.0 && curve[102].1 == 1.0,
            "{series}: {curve:?}"
        );
    }
    assert!(std::fs::read(out.join("figure.png")).unwrap().len() > 1000);

    // A swept setting has no place in a CDF figure.
    let bad = std::fs::read_to_string(&spec).unwrap().replace(
        "cdf = true",
        "cdf = true\nparam = \"workload.ycsb.theta\"\nvalues = [0.0, 0.5]",
    );
    std::fs::write(&spec, bad).unwrap();
    let o = run(&[
        "figure",
        spec.to_str().unwrap(),
        "--out",
        dir.join("bad").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("[x] cdf takes no param, values or points"),
        "{}",
        text(&o.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
