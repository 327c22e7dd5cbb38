//! wrk report parsing on real outputs (wrk 4.1.0), byte for byte.

use refract_lab::bench::sweep::wrk::{parse_bytes, parse_latency_us, WrkReport};

const OK: &[u8] = b"Running 1s test @ http://127.0.0.1:18777/
  1 threads and 1 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   366.48us   92.98us   1.80ms   86.17%
    Req/Sec     2.29k   125.92     2.47k    63.64%
  Latency Distribution
     50%  330.00us
     75%  430.00us
     90%  468.00us
     99%  596.00us
  2509 requests in 1.10s, 1.57MB read
Requests/sec:   2281.92
Transfer/sec:      1.43MB
";

const NON_2XX: &[u8] = b"Running 1s test @ http://127.0.0.1:18777/nope
  1 threads and 1 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   371.40us  196.65us   3.84ms   96.99%
    Req/Sec     2.39k   126.80     2.60k    70.00%
  Latency Distribution
     50%  352.00us
     75%  413.00us
     90%  488.00us
     99%  690.00us
  2375 requests in 1.00s, 1.18MB read
  Non-2xx or 3xx responses: 2375
Requests/sec:   2374.36
Transfer/sec:      1.18MB
";

const BIG_WITH_TIMEOUTS: &[u8] = b"Running 5s test @ http://198.18.0.100:8080/blob?bytes=134217728
  1 threads and 1 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.07s    12.52ms   1.09s    75.00%
    Req/Sec     0.00      0.00     0.00    100.00%
  Latency Distribution
     50%    1.07s
     75%    1.08s
     90%    1.09s
     99%    1.09s
  4 requests in 5.01s, 592.31MB read
  Socket errors: connect 0, read 1, write 0, timeout 2
Requests/sec:      0.80
Transfer/sec:    118.23MB
";

fn parse(b: &[u8]) -> WrkReport {
    WrkReport::parse(std::str::from_utf8(b).expect("utf-8")).expect("parse")
}

#[test]
fn clean_run() {
    let r = parse(OK);
    assert_eq!(r.requests_per_sec, 2281.92);
    assert_eq!(r.requests, 2509);
    assert!((r.seconds - 1.10).abs() < 1e-9);
    assert!((r.bytes_read - 1.57 * 1048576.0).abs() < 1.0);
    assert!((r.latency_avg_us - 366.48).abs() < 1e-9);
    assert_eq!(r.latency_p50_us, Some(330.0));
    assert_eq!(r.latency_p99_us, Some(596.0));
    assert_eq!((r.non_2xx, r.socket_errors), (0, 0));
    assert!(!r.has_errors());
}

#[test]
fn non_2xx_is_flagged() {
    let r = parse(NON_2XX);
    assert_eq!(r.non_2xx, 2375);
    assert!(r.has_errors());
}

#[test]
fn seconds_units_and_socket_errors() {
    let r = parse(BIG_WITH_TIMEOUTS);
    assert!((r.latency_avg_us - 1.07e6).abs() < 1e-3);
    assert_eq!(r.latency_p99_us, Some(1.09e6));
    assert_eq!(r.requests, 4);
    assert!((r.seconds - 5.01).abs() < 1e-9);
    assert_eq!(r.socket_errors, 3);
    assert!(r.has_errors());
}

#[test]
fn garbage_is_an_error() {
    assert!(WrkReport::parse("unable to connect to 198.18.0.21:9000 Connection refused").is_err());
    assert!(WrkReport::parse("").is_err());
}

#[test]
fn units() {
    assert_eq!(parse_latency_us("52.30us").expect("us"), 52.3);
    assert_eq!(parse_latency_us("1.50ms").expect("ms"), 1500.0);
    assert_eq!(parse_latency_us("2.00s").expect("s"), 2e6);
    assert_eq!(parse_latency_us("1.00m").expect("m"), 60e6);
    assert!(parse_latency_us("3.0parsecs").is_err());
    assert_eq!(parse_bytes("512.00B").expect("B"), 512.0);
    assert_eq!(parse_bytes("2.00KB").expect("KB"), 2048.0);
    assert_eq!(parse_bytes("1.00GB").expect("GB"), 1073741824.0);
    assert!(parse_bytes("1.00XB").is_err());
}
