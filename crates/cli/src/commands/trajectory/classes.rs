//! Role classes from TOML (`--classes FILE`), for harnesses other than Claude Code.
//!
//! ```toml
//! [[class]]            # listed in priority order, highest first
//! name = "main"
//! agent = "main"       # exact agent id; or agent_except = "main"; or agent_prefix = "worker-"
//! kind = "turn"        # "turn" | "summary"; omit for any kind
//! ```

use anyhow::{anyhow, bail, Context, Result};
use gyre_event::CallKind;
use gyre_trajectory::{AgentRule, RoleClass, RoleClasses};

pub fn load(path: Option<&std::path::Path>) -> Result<RoleClasses> {
    let Some(path) = path else {
        return Ok(RoleClasses::claude_code());
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse(&text).with_context(|| format!("invalid role classes in {}", path.display()))
}

pub fn parse(text: &str) -> Result<RoleClasses> {
    let value: toml::Table = text.parse().map_err(|error| anyhow!("{error}"))?;
    let Some(toml::Value::Array(entries)) = value.get("class") else {
        bail!("field `class`: expected an array of [[class]] tables");
    };
    let mut classes = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let table = entry
            .as_table()
            .ok_or_else(|| anyhow!("field `class[{index}]`: expected a table"))?;
        for key in table.keys() {
            if !["name", "agent", "agent_except", "agent_prefix", "kind"].contains(&key.as_str()) {
                bail!("field `class[{index}].{key}`: unknown field");
            }
        }
        let text_of = |key: &str| -> Result<Option<String>> {
            match table.get(key) {
                None => Ok(None),
                Some(toml::Value::String(text)) => Ok(Some(text.clone())),
                Some(_) => bail!("field `class[{index}].{key}`: expected a string"),
            }
        };
        let name =
            text_of("name")?.ok_or_else(|| anyhow!("field `class[{index}].name`: missing"))?;
        let rules = [
            text_of("agent")?.map(AgentRule::Exactly),
            text_of("agent_except")?.map(AgentRule::AnyExcept),
            text_of("agent_prefix")?.map(AgentRule::Prefix),
        ];
        let mut given = rules.into_iter().flatten();
        let agent = given.next().unwrap_or(AgentRule::Any);
        if given.next().is_some() {
            bail!("field `class[{index}]`: give at most one of agent, agent_except, agent_prefix");
        }
        let kind = match text_of("kind")?.as_deref() {
            None => None,
            Some("turn") => Some(CallKind::Turn),
            Some("summary") => Some(CallKind::Summary),
            Some(other) => bail!(
                "field `class[{index}].kind`: unknown kind `{other}` (expected turn or summary)"
            ),
        };
        classes.push(RoleClass { name, agent, kind });
    }
    RoleClasses::new(classes).map_err(|error| anyhow!("{error}"))
}
