//! `strftime_now(format)` without a clock: Python's `datetime.strftime` (glibc, C locale) over
//! a civil date-time handed in by the caller.
//!
//! HF transformers defines `strftime_now` as `datetime.now().strftime(format)`; templates such
//! as Llama 3.x print today's date with it. The proxy is pure, so the date is an input
//! ([`CivilDateTime`]), stamped once by the server.

/// A naive (time-zone-less) date and time, as `datetime.now()` returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CivilDateTime {
    pub year: i32,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Days since 1970-01-01 (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i32, month: u32, day: u32) -> i64 {
    let year = i64::from(year) - i64::from(month <= 2);
    let era = if year >= 0 { year } else { year - 399 } / 400;
    let year_of_era = year - era * 400;
    let month = i64::from(month);
    let day_of_year =
        (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

impl CivilDateTime {
    /// The UTC civil time `seconds` after the Unix epoch (for the server, which reads the clock).
    pub fn from_unix_seconds(seconds: i64) -> Self {
        let days = seconds.div_euclid(86_400);
        let seconds_of_day = seconds.rem_euclid(86_400);
        // Hinnant's `civil_from_days`.
        let shifted = days + 719_468;
        let era = if shifted >= 0 {
            shifted
        } else {
            shifted - 146_096
        } / 146_097;
        let day_of_era = shifted - era * 146_097;
        let year_of_era =
            (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
        let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
        let month_index = (5 * day_of_year + 2) / 153;
        let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
        let month = if month_index < 10 {
            month_index + 3
        } else {
            month_index - 9
        } as u32;
        let year = (year_of_era + era * 400 + i64::from(month <= 2)) as i32;
        Self {
            year,
            month,
            day,
            hour: (seconds_of_day / 3600) as u32,
            minute: (seconds_of_day % 3600 / 60) as u32,
            second: (seconds_of_day % 60) as u32,
        }
    }

    /// 0 = Monday … 6 = Sunday.
    fn weekday(&self) -> usize {
        // 1970-01-01 was a Thursday (3).
        (days_from_civil(self.year, self.month, self.day) + 3).rem_euclid(7) as usize
    }

    /// 1-based day of the year.
    fn day_of_year(&self) -> u32 {
        (days_from_civil(self.year, self.month, self.day) - days_from_civil(self.year, 1, 1)) as u32
            + 1
    }

    fn month_name(&self) -> &'static str {
        MONTHS[(self.month.clamp(1, 12) - 1) as usize]
    }

    /// Python `strftime(format)` on Linux. Unknown directives are copied through, as glibc does.
    pub fn strftime(&self, format: &str) -> String {
        let mut out = String::new();
        let mut chars = format.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            // glibc flag: `%-d` drops the padding.
            let unpadded = chars.peek() == Some(&'-');
            if unpadded {
                chars.next();
            }
            let Some(directive) = chars.next() else {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                break;
            };
            let number = |value: u32, width: usize, pad: char| -> String {
                if unpadded {
                    value.to_string()
                } else if pad == ' ' {
                    format!("{value:>width$}")
                } else {
                    format!("{value:0width$}")
                }
            };
            let hour12 = match self.hour % 12 {
                0 => 12,
                hour => hour,
            };
            let weekday = self.weekday();
            match directive {
                'a' => out.push_str(&WEEKDAYS[weekday][..3]),
                'A' => out.push_str(WEEKDAYS[weekday]),
                'w' => out.push_str(&((weekday + 1) % 7).to_string()),
                'u' => out.push_str(&(weekday + 1).to_string()),
                'd' => out.push_str(&number(self.day, 2, '0')),
                'e' => out.push_str(&number(self.day, 2, ' ')),
                'b' | 'h' => out.push_str(&self.month_name()[..3]),
                'B' => out.push_str(self.month_name()),
                'm' => out.push_str(&number(self.month, 2, '0')),
                'y' => out.push_str(&number(self.year.rem_euclid(100) as u32, 2, '0')),
                'Y' => out.push_str(&self.year.to_string()),
                'C' => out.push_str(&number(self.year.div_euclid(100) as u32, 2, '0')),
                'H' => out.push_str(&number(self.hour, 2, '0')),
                'k' => out.push_str(&number(self.hour, 2, ' ')),
                'I' => out.push_str(&number(hour12, 2, '0')),
                'l' => out.push_str(&number(hour12, 2, ' ')),
                'p' => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                'P' => out.push_str(if self.hour < 12 { "am" } else { "pm" }),
                'M' => out.push_str(&number(self.minute, 2, '0')),
                'S' => out.push_str(&number(self.second, 2, '0')),
                'f' => out.push_str("000000"),
                'j' => out.push_str(&number(self.day_of_year(), 3, '0')),
                'D' | 'x' => out.push_str(&format!(
                    "{:02}/{:02}/{:02}",
                    self.month,
                    self.day,
                    self.year.rem_euclid(100)
                )),
                'F' => out.push_str(&format!("{}-{:02}-{:02}", self.year, self.month, self.day)),
                'T' | 'X' => out.push_str(&format!(
                    "{:02}:{:02}:{:02}",
                    self.hour, self.minute, self.second
                )),
                'R' => out.push_str(&format!("{:02}:{:02}", self.hour, self.minute)),
                'c' => out.push_str(&format!(
                    "{} {} {:>2} {:02}:{:02}:{:02} {}",
                    &WEEKDAYS[weekday][..3],
                    &self.month_name()[..3],
                    self.day,
                    self.hour,
                    self.minute,
                    self.second,
                    self.year
                )),
                // A naive datetime has no offset or zone name.
                'z' | 'Z' => {}
                'n' => out.push('\n'),
                't' => out.push('\t'),
                '%' => out.push('%'),
                other => {
                    out.push('%');
                    if unpadded {
                        out.push('-');
                    }
                    out.push(other);
                }
            }
        }
        out
    }
}
