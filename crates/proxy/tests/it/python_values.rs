//! Python `float.__repr__` and `strftime` without a clock.

use gyre_proxy::template::python::float_repr;
use gyre_proxy::template::CivilDateTime;

#[test]
fn floats_print_like_python_repr() {
    let cases: [(f64, &str); 16] = [
        (1.0, "1.0"),
        (0.5, "0.5"),
        (-2.25, "-2.25"),
        (1e16, "1e+16"),
        (9999999999999998.0, "9999999999999998.0"),
        (1e15, "1000000000000000.0"),
        (1e-4, "0.0001"),
        (1e-5, "1e-05"),
        (1.5e-7, "1.5e-07"),
        (0.1 + 0.2, "0.30000000000000004"),
        (123456789.123, "123456789.123"),
        (f64::MAX, "1.7976931348623157e+308"),
        (5e-324, "5e-324"),
        (-0.0, "-0.0"),
        (f64::INFINITY, "inf"),
        (f64::NAN, "nan"),
    ];
    for (value, wanted) in cases {
        assert_eq!(float_repr(value), wanted, "{value:e}");
    }
}

#[test]
fn civil_time_from_unix_seconds() {
    let epoch = CivilDateTime::from_unix_seconds(0);
    assert_eq!(
        epoch.strftime("%Y-%m-%d %H:%M:%S %A"),
        "1970-01-01 00:00:00 Thursday"
    );
    let leap = CivilDateTime::from_unix_seconds(1_709_208_000); // 2024-02-29 12:00:00 UTC
    assert_eq!(leap.strftime("%d %b %Y %I%p %j"), "29 Feb 2024 12PM 060");
    let before = CivilDateTime::from_unix_seconds(-1);
    assert_eq!(before.strftime("%F %T"), "1969-12-31 23:59:59");
    let late = CivilDateTime::from_unix_seconds(1_796_212_800); // 2026-12-02 12:00:00 UTC
    assert_eq!(late.strftime("%-d %B %Y, %a"), "2 December 2026, Wed");
}

#[test]
fn strftime_passes_unknown_directives_through() {
    let now = CivilDateTime::from_unix_seconds(0);
    assert_eq!(now.strftime("%Q|%|100%%|%"), "%Q|%|100%|%");
}
