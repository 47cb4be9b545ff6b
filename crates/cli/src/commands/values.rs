//! clap value parsers the commands share: numbers that must be finite and within bounds, and
//! counts that must be at least one. clap runs them while it parses, so a bad value is refused
//! with the flag's name and status 2 before a command starts any work (a benchmark would
//! otherwise measure its anchors first and then panic on `Duration::from_secs_f64(-1.0)`).

/// The most seconds a duration flag takes: a year. More would overflow `Instant + Duration`.
const SECONDS_MAX: f64 = 365.0 * 24.0 * 3600.0;

/// A duration in seconds that must be above zero (`--seconds`).
pub(crate) fn positive_seconds(text: &str) -> Result<f64, String> {
    let seconds = finite(text)?;
    if seconds > 0.0 && seconds <= SECONDS_MAX {
        Ok(seconds)
    } else {
        Err(format!(
            "expected seconds above 0 and at most {SECONDS_MAX}"
        ))
    }
}

/// A duration in seconds where 0 means "never" (`--restart-every`).
pub(crate) fn non_negative_seconds(text: &str) -> Result<f64, String> {
    let seconds = finite(text)?;
    if (0.0..=SECONDS_MAX).contains(&seconds) {
        Ok(seconds)
    } else {
        Err(format!("expected seconds from 0 to {SECONDS_MAX}"))
    }
}

/// A finite number above zero (`--training-work-ratio`).
pub(crate) fn positive(text: &str) -> Result<f64, String> {
    let value = finite(text)?;
    if value > 0.0 {
        Ok(value)
    } else {
        Err("expected a number above 0".to_string())
    }
}

/// A finite number of at least zero (`--decode-ms-per-token`).
pub(crate) fn non_negative(text: &str) -> Result<f64, String> {
    let value = finite(text)?;
    if value >= 0.0 {
        Ok(value)
    } else {
        Err("expected a number of at least 0".to_string())
    }
}

/// A count of at least one, as a `usize` (`--concurrency`, `--context-max`).
pub(crate) fn at_least_one_usize() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
}

/// A size in bytes (`--archive-max-size`): a whole number of bytes, or a number with a unit,
/// binary (`KiB`, `MiB`, `GiB`, `TiB`) or decimal (`KB`, `MB`, `GB`, `TB`), e.g. `500GiB`,
/// `1.5TB`. A newtype, so a TOML config gives it as a string (`"500GiB"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ByteSize(pub u64);

pub(crate) fn byte_size(text: &str) -> Result<ByteSize, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{text}`: expected bytes or KiB, MiB, GiB, TiB, KB, MB, GB, TB"
            ))
        }
    };
    if scale == 1 {
        // Bytes are whole and exact (no float on the way).
        return number.parse::<u64>().map(ByteSize).map_err(|_| {
            format!("expected a whole number of bytes or a size such as 500GiB, got `{text}`")
        });
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("expected a size such as 500GiB, got `{text}`"))?;
    let bytes = (value * scale as f64).round();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("`{text}` is too large"));
    }
    if bytes == 0.0 && value != 0.0 {
        return Err(format!("`{text}` is less than a byte (0 means no limit)"));
    }
    Ok(ByteSize(bytes as u64))
}

fn finite(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("expected a number, got `{text}`"))?;
    if value.is_finite() {
        Ok(value)
    } else {
        Err("expected a finite number".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_rates_refuse_what_would_panic_later() {
        assert_eq!(positive_seconds("3"), Ok(3.0));
        assert_eq!(positive_seconds("0.5"), Ok(0.5));
        for bad in ["0", "-1", "nan", "inf", "-inf", "1e30", "three", ""] {
            assert!(positive_seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(non_negative_seconds("0"), Ok(0.0));
        for bad in ["-0.1", "nan", "inf", "1e30"] {
            assert!(non_negative_seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(positive("2"), Ok(2.0));
        for bad in ["0", "-1", "nan", "inf"] {
            assert!(positive(bad).is_err(), "{bad}");
        }
        assert_eq!(non_negative("0"), Ok(0.0));
        assert_eq!(non_negative("12.5"), Ok(12.5));
        for bad in ["-1", "nan", "inf"] {
            assert!(non_negative(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_take_binary_and_decimal_units() {
        assert_eq!(byte_size("0"), Ok(ByteSize(0)));
        assert_eq!(byte_size("4096"), Ok(ByteSize(4096)));
        assert_eq!(byte_size("64MiB"), Ok(ByteSize(64 << 20)));
        assert_eq!(byte_size("500 GiB"), Ok(ByteSize(500 << 30)));
        assert_eq!(byte_size("1.5TB"), Ok(ByteSize(1_500_000_000_000)));
        assert_eq!(byte_size("2KB"), Ok(ByteSize(2_000)));
        assert_eq!(byte_size("0.5KiB"), Ok(ByteSize(512)));
        assert_eq!(
            byte_size("18446744073709551615"),
            Ok(ByteSize(u64::MAX)),
            "bytes are exact"
        );
        for bad in [
            "",
            "GiB",
            "-1GiB",
            "5 parsecs",
            "1e3",
            "1..2MiB",
            "99999999999TiB",
            "1.5",
            "0.4B",
            "0.0000000001KiB",
            "18446744073709551616",
        ] {
            assert!(byte_size(bad).is_err(), "{bad}");
        }
    }
}
