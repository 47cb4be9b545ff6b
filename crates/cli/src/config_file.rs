//! `--config FILE` for the long-running services (`gyre control run`, `gyre proxy`).
//!
//! The file is TOML whose keys are the command's long flags, written with underscores or
//! dashes (`data_dir` or `data-dir`); `peers` may also be a table `{1 = "host:port", ...}`.
//! Every key is checked before the command runs: an unknown key, a value of the wrong TOML type
//! or a value the flag's own parser refuses is an error naming the file and the field. The
//! checked values become flags placed before the command line's own, and a flag given on the
//! command line replaces the file's value for that field. So a deployment keeps one file per
//! node and an operator can still override one field by hand.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{anyhow, Context};
use clap::{ArgAction, Command};

/// Keys that are not settings.
const NOT_SETTINGS: [&str; 4] = ["config", "check", "help", "version"];

/// The commands whose `--config` is a file of their own flags (`gyre simulate --config` is a
/// simulation config with its own schema and is not expanded).
const SERVICES: [&[&str]; 2] = [&["control", "run"], &["proxy"]];

/// `argv` with the `--config` file's settings spliced in after the subcommand names, or `argv`
/// unchanged unless a service command is given `--config`.
pub fn expand(root: &Command, argv: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    // Walk the subcommand names from the front (the binary name comes first).
    let mut command = root;
    let mut position = 1;
    let mut path: Vec<&str> = Vec::new();
    while let Some(name) = argv.get(position).and_then(|word| word.to_str()) {
        match command.find_subcommand(name) {
            Some(sub) => {
                command = sub;
                path.push(name);
                position += 1;
            }
            None => break,
        }
    }
    if !SERVICES.contains(&path.as_slice())
        || !command.get_arguments().any(|arg| arg.get_id() == "config")
    {
        return Ok(argv);
    }
    let rest: Vec<String> = argv[position..]
        .iter()
        .map(|word| word.to_string_lossy().into_owned())
        .collect();
    let Some(path) = config_path(&rest) else {
        return Ok(argv);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the config file {path}"))?;
    let settings = settings(command, Path::new(&path), &text, &rest)?;
    let mut expanded = argv[..position].to_vec();
    expanded.extend(settings.into_iter().map(OsString::from));
    expanded.extend(argv[position..].iter().cloned());
    Ok(expanded)
}

/// The value of `--config` among a command's own words (the last one wins, as for any flag).
fn config_path(words: &[String]) -> Option<String> {
    let mut path = None;
    let mut words = words.iter();
    while let Some(word) = words.next() {
        if word == "--" {
            break;
        }
        if word == "--config" {
            path = words.next().cloned();
        } else if let Some(value) = word.strip_prefix("--config=") {
            path = Some(value.to_string());
        }
    }
    path
}

/// The flags a config file stands for, each value checked by the flag's own parser. Fields the
/// command line sets itself (`given`) are checked but left out.
pub fn settings(
    command: &Command,
    path: &Path,
    text: &str,
    given: &[String],
) -> anyhow::Result<Vec<String>> {
    let file = path.display();
    let table: toml::Table = text
        .parse()
        .map_err(|error: toml::de::Error| anyhow!("{file}: {}", error.to_string().trim_end()))?;
    let mut flags = Vec::new();
    let mut seen: std::collections::BTreeMap<String, &str> = std::collections::BTreeMap::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        if let Some(first) = seen.insert(long.clone(), key) {
            return Err(anyhow!(
                "{file}: field `{}` is given twice (as `{first}` and `{key}`)",
                long.replace('-', "_")
            ));
        }
        let arg = command
            .get_arguments()
            .find(|arg| arg.get_long() == Some(long.as_str()))
            .filter(|_| !NOT_SETTINGS.contains(&long.as_str()))
            .ok_or_else(|| {
                let known: Vec<String> = command
                    .get_arguments()
                    .filter_map(|arg| arg.get_long())
                    .filter(|long| !NOT_SETTINGS.contains(long))
                    .map(|long| long.replace('-', "_"))
                    .collect();
                anyhow!(
                    "{file}: unknown field `{key}`; the fields of `{}` are: {}",
                    command.get_name(),
                    known.join(", ")
                )
            })?;
        let field_error = |why: String| anyhow!("{file}: field `{key}`: {why}");
        let values: Vec<String> = match (arg.get_action(), value) {
            (ArgAction::SetTrue, toml::Value::Boolean(on)) => {
                if *on {
                    flags_if_not_given(&mut flags, &long, None, given);
                }
                continue;
            }
            (ArgAction::SetTrue, other) => {
                return Err(field_error(format!(
                    "expected true or false, found {}",
                    other.type_str()
                )))
            }
            (ArgAction::Append, toml::Value::Array(items)) => items
                .iter()
                .map(|item| scalar(item).map_err(&field_error))
                .collect::<anyhow::Result<_>>()?,
            (_, toml::Value::Table(entries)) if long == "peers" || long == "nodes" => {
                let pairs: Vec<String> = entries
                    .iter()
                    .map(|(id, address)| {
                        scalar(address)
                            .map(|address| format!("{id}={address}"))
                            .map_err(|why| anyhow!("{file}: field `{key}.{id}`: {why}"))
                    })
                    .collect::<anyhow::Result<_>>()?;
                vec![pairs.join(",")]
            }
            (_, value) => vec![scalar(value).map_err(&field_error)?],
        };
        let wanted = toml_kind(arg);
        let given_kinds: Vec<&toml::Value> = match value {
            toml::Value::Array(items) => items.iter().collect(),
            toml::Value::Table(_) => Vec::new(),
            other => vec![other],
        };
        for item in given_kinds {
            if !wanted.admits(item) {
                return Err(field_error(format!(
                    "expected {}, found {}",
                    wanted.describe(),
                    item.type_str()
                )));
            }
        }
        // A field the command line overrides through a conflicting flag (`--log` on the
        // command line, `cluster` in the file) gives way to it, as the same field would.
        // Conflicts are declared on one side (`log` conflicts with `cluster`): both are read.
        let conflicts = |one: &clap::Arg, other: &clap::Arg| {
            command
                .get_arg_conflicts_with(one)
                .iter()
                .any(|conflict| conflict.get_id() == other.get_id())
        };
        let overridden = command.get_arguments().any(|other| {
            (conflicts(arg, other) || conflicts(other, arg))
                && other.get_long().is_some_and(|other| {
                    let flag = format!("--{other}");
                    let prefix = format!("--{other}=");
                    given
                        .iter()
                        .take_while(|word| *word != "--")
                        .any(|word| *word == flag || word.starts_with(&prefix))
                })
        });
        // The flag's own parser, alone on a throw-away command (the real one would also
        // insist on its required flags).
        let mut parser = clap::Arg::new(arg.get_id().clone())
            .value_parser(arg.get_value_parser().clone())
            .action(ArgAction::Set)
            .allow_hyphen_values(true);
        if let Some(names) = arg.get_value_names() {
            parser = parser.value_names(names.to_vec());
        }
        let alone = Command::new("config").no_binary_name(true).arg(parser);
        for value in &values {
            alone
                .clone()
                .try_get_matches_from([value.clone()])
                .map_err(|error| field_error(clap_reason(&error)))?;
        }
        if overridden {
            continue;
        }
        for value in values {
            flags_if_not_given(&mut flags, &long, Some(value), given);
        }
    }
    Ok(flags)
}

/// The TOML type a flag's values must have, from the type its parser yields.
#[derive(Clone, Copy)]
enum TomlKind {
    Integer,
    Number,
    Boolean,
    Text,
    /// A size: bytes as an integer, or a string with a unit (`"500GiB"`).
    Size,
}

impl TomlKind {
    fn admits(self, value: &toml::Value) -> bool {
        matches!(
            (self, value),
            (TomlKind::Integer, toml::Value::Integer(_))
                | (
                    TomlKind::Number,
                    toml::Value::Integer(_) | toml::Value::Float(_)
                )
                | (TomlKind::Boolean, toml::Value::Boolean(_))
                | (TomlKind::Text, toml::Value::String(_))
                | (
                    TomlKind::Size,
                    toml::Value::Integer(_) | toml::Value::String(_)
                )
        )
    }

    fn describe(self) -> &'static str {
        match self {
            TomlKind::Integer => "an integer",
            TomlKind::Number => "a number",
            TomlKind::Boolean => "true or false",
            TomlKind::Text => "a string",
            TomlKind::Size => "a size (bytes, or a string such as \"500GiB\")",
        }
    }
}

fn toml_kind(arg: &clap::Arg) -> TomlKind {
    use std::any::TypeId;
    let id = arg.get_value_parser().type_id();
    let integers = [
        TypeId::of::<u8>(),
        TypeId::of::<u16>(),
        TypeId::of::<u32>(),
        TypeId::of::<u64>(),
        TypeId::of::<usize>(),
        TypeId::of::<i32>(),
        TypeId::of::<i64>(),
    ];
    if integers.iter().any(|integer| id == *integer) {
        TomlKind::Integer
    } else if id == TypeId::of::<f32>() || id == TypeId::of::<f64>() {
        TomlKind::Number
    } else if id == TypeId::of::<bool>() {
        TomlKind::Boolean
    } else if id == TypeId::of::<crate::commands::values::ByteSize>() {
        TomlKind::Size
    } else {
        TomlKind::Text
    }
}

fn flags_if_not_given(
    flags: &mut Vec<String>,
    long: &str,
    value: Option<String>,
    given: &[String],
) {
    let flag = format!("--{long}");
    let prefix = format!("--{long}=");
    if given
        .iter()
        .take_while(|word| *word != "--")
        .any(|word| *word == flag || word.starts_with(&prefix))
    {
        return;
    }
    flags.push(flag);
    flags.extend(value);
}

/// A TOML value that stands for one flag value.
fn scalar(value: &toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(text) => Ok(text.clone()),
        toml::Value::Integer(number) => Ok(number.to_string()),
        toml::Value::Float(number) => Ok(number.to_string()),
        toml::Value::Boolean(on) => Ok(on.to_string()),
        other => Err(format!("expected one value, found {}", other.type_str())),
    }
}

/// clap's message for a refused value, without its `error:` prefix, the throw-away argument's
/// name and the usage footer; the possible values of an enum field are kept.
fn clap_reason(error: &clap::Error) -> String {
    let text = error.to_string();
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    let mut reason = first.strip_prefix("error: ").unwrap_or(first).to_string();
    if let Some(start) = reason.find(" for '") {
        if let Some(length) = reason[start + 6..].find('\'') {
            reason.replace_range(start..start + 6 + length + 1, "");
        }
    }
    if let Some(possible) = lines.find(|line| line.trim_start().starts_with("[possible values:")) {
        reason.push(' ');
        reason.push_str(possible.trim());
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    fn command() -> Command {
        Command::new("run")
            .arg(Arg::new("config").long("config"))
            .arg(
                Arg::new("id")
                    .long("id")
                    .value_parser(clap::value_parser!(u64)),
            )
            .arg(
                Arg::new("listen")
                    .long("listen")
                    .value_parser(clap::value_parser!(std::net::SocketAddr)),
            )
            .arg(Arg::new("peers").long("peers"))
            .arg(Arg::new("data_dir").long("data-dir"))
            .arg(
                Arg::new("engine_url")
                    .long("engine-url")
                    .action(ArgAction::Append),
            )
            .arg(
                Arg::new("auto_open")
                    .long("auto-open")
                    .action(ArgAction::SetTrue),
            )
    }

    fn flags(text: &str, given: &[&str]) -> anyhow::Result<Vec<String>> {
        let given: Vec<String> = given.iter().map(|word| word.to_string()).collect();
        settings(&command(), Path::new("node.toml"), text, &given)
    }

    #[test]
    fn fields_become_flags() {
        let text = r#"
id = 3
data_dir = "/var/lib/gyre"
listen = "0.0.0.0:7000"
engine_url = ["http://a:1", "http://b:2"]
auto_open = true
[peers]
1 = "gyre-0:7000"
2 = "gyre-1:7000"
"#;
        assert_eq!(
            flags(text, &[]).unwrap(),
            [
                "--auto-open",
                "--data-dir",
                "/var/lib/gyre",
                "--engine-url",
                "http://a:1",
                "--engine-url",
                "http://b:2",
                "--id",
                "3",
                "--listen",
                "0.0.0.0:7000",
                "--peers",
                "1=gyre-0:7000,2=gyre-1:7000",
            ]
        );
    }

    #[test]
    fn dashed_keys_and_false_switches() {
        let text = "data-dir = \"d\"\nauto_open = false\n";
        assert_eq!(flags(text, &[]).unwrap(), ["--data-dir", "d"]);
    }

    #[test]
    fn the_command_line_replaces_a_field() {
        let text = "id = 3\nlisten = \"127.0.0.1:1\"\nengine_url = [\"http://a:1\"]\n";
        assert_eq!(
            flags(text, &["--id", "4", "--engine-url=http://c:3"]).unwrap(),
            ["--listen", "127.0.0.1:1"]
        );
        // Words after `--` are not flags.
        assert_eq!(flags("id = 3\n", &["--", "--id"]).unwrap(), ["--id", "3"]);
    }

    #[test]
    fn values_of_the_wrong_toml_type_are_refused() {
        let message = |text: &str| flags(text, &[]).unwrap_err().to_string();
        assert_eq!(
            message("id = \"3\"\n"),
            "node.toml: field `id`: expected an integer, found string"
        );
        assert_eq!(
            message("id = 3.0\n"),
            "node.toml: field `id`: expected an integer, found float"
        );
        assert_eq!(
            message("data_dir = 5\n"),
            "node.toml: field `data_dir`: expected a string, found integer"
        );
        assert_eq!(
            message("engine_url = [\"http://a:1\", 2]\n"),
            "node.toml: field `engine_url`: expected a string, found integer"
        );
    }

    #[test]
    fn a_field_given_twice_is_refused() {
        let error = flags("data_dir = \"a\"\ndata-dir = \"b\"\n", &[]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "node.toml: field `data_dir` is given twice (as `data-dir` and `data_dir`)"
        );
    }

    #[test]
    fn a_conflicting_flag_on_the_command_line_replaces_the_field() {
        let command = command()
            .arg(Arg::new("log").long("log").conflicts_with("cluster"))
            .arg(Arg::new("cluster").long("cluster"));
        let given = ["--log".to_string(), "x.log".to_string()];
        let flags = settings(
            &command,
            Path::new("p.toml"),
            "cluster = \"a:1\"\nid = 2\n",
            &given,
        )
        .unwrap();
        assert_eq!(flags, ["--id", "2"]);
    }

    #[test]
    fn errors_name_the_file_and_field() {
        let message = |text: &str| flags(text, &[]).unwrap_err().to_string();
        assert_eq!(
            message("lisen = \"x\"\n"),
            "node.toml: unknown field `lisen`; the fields of `run` are: id, listen, peers, data_dir, engine_url, auto_open"
        );
        assert!(
            message("listen = \"nowhere\"\n")
                == "node.toml: field `listen`: invalid value 'nowhere': invalid socket address syntax",
            "{}",
            message("listen = \"nowhere\"\n")
        );
        assert!(
            message("id = -1\n").starts_with("node.toml: field `id`: invalid value '-1': "),
            "{}",
            message("id = -1\n")
        );
        assert_eq!(
            message("id = [1, 2]\n"),
            "node.toml: field `id`: expected one value, found array"
        );
        assert_eq!(
            message("auto_open = \"yes\"\n"),
            "node.toml: field `auto_open`: expected true or false, found string"
        );
        assert_eq!(
            message("[peers]\n1 = [\"a\"]\n"),
            "node.toml: field `peers.1`: expected one value, found array"
        );
        assert_eq!(
            message("config = \"other.toml\"\n"),
            "node.toml: unknown field `config`; the fields of `run` are: id, listen, peers, data_dir, engine_url, auto_open"
        );
        let syntax = message("id = \n");
        assert!(
            syntax.starts_with("node.toml: TOML parse error at line 1"),
            "{syntax}"
        );
    }

    #[test]
    fn expand_splices_after_the_subcommand() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node.toml");
        std::fs::write(&file, "id = 3\nlisten = \"127.0.0.1:7000\"\n").unwrap();
        let root = Command::new("gyre").subcommand(Command::new("control").subcommand(command()));
        let argv: Vec<OsString> = ["gyre", "control", "run", "--config"]
            .iter()
            .map(OsString::from)
            .chain([
                file.clone().into_os_string(),
                OsString::from("--id"),
                OsString::from("5"),
            ])
            .collect();
        let expanded = expand(&root, argv).unwrap();
        let words: Vec<String> = expanded
            .iter()
            .map(|word| word.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            words,
            [
                "gyre",
                "control",
                "run",
                "--listen",
                "127.0.0.1:7000",
                "--config",
                &file.display().to_string(),
                "--id",
                "5"
            ]
        );
        // Another command's --config is its own business.
        let simulate = Command::new("gyre")
            .subcommand(Command::new("simulate").arg(Arg::new("config").long("config")));
        let other: Vec<OsString> = ["gyre", "simulate", "--config", "/nonexistent/sim.toml"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(expand(&simulate, other.clone()).unwrap(), other);
        // No --config: unchanged.
        let plain: Vec<OsString> = ["gyre", "control", "run", "--id", "1"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(expand(&root, plain.clone()).unwrap(), plain);
        // A missing file names itself.
        let missing: Vec<OsString> = ["gyre", "control", "run", "--config", "/nonexistent/x.toml"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(
            format!("{:#}", expand(&root, missing).unwrap_err())
                .split(':')
                .next(),
            Some("reading the config file /nonexistent/x.toml")
        );
    }
}
