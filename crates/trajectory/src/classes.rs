//! Role classes: how a harness's leaves are ranked for admission.
//!
//! A class is a named rule on the leaf call's agent id and kind hint; classes are listed in
//! priority order (index 0 = highest) and a leaf takes the first class whose rule it matches.
//! Leaves that match no class are not candidates. Claude Code's order is the paper's eq (4):
//! main > main-summary > sub-agent > sub-agent-summary, decided from the agent id (sub-agents
//! arrive with their own agent id) and the summary/compaction hint. Other harnesses write their
//! own list (the CLI reads it from TOML).

use gyre_event::CallKind;

use crate::TrajectoryError;

/// Which agent ids a class accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentRule {
    Any,
    Exactly(String),
    /// Any agent id except this one (Claude Code: every sub-agent is "not main").
    AnyExcept(String),
    Prefix(String),
}

impl AgentRule {
    pub fn matches(&self, agent: &str) -> bool {
        match self {
            AgentRule::Any => true,
            AgentRule::Exactly(name) => agent == name,
            AgentRule::AnyExcept(name) => agent != name,
            AgentRule::Prefix(prefix) => agent.starts_with(prefix.as_str()),
        }
    }
}

/// One role class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleClass {
    pub name: String,
    pub agent: AgentRule,
    /// `None` accepts every kind.
    pub kind: Option<CallKind>,
}

/// Role classes in priority order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleClasses {
    classes: Vec<RoleClass>,
}

/// Most classes one harness may define.
pub const ROLE_CLASSES_MAX: usize = 64;

impl RoleClasses {
    pub fn new(classes: Vec<RoleClass>) -> Result<Self, TrajectoryError> {
        if classes.is_empty() {
            return Err(TrajectoryError::Config {
                field: "class",
                message: "at least one role class is needed".into(),
            });
        }
        if classes.len() > ROLE_CLASSES_MAX {
            return Err(TrajectoryError::Config {
                field: "class",
                message: format!("{} classes, at most {ROLE_CLASSES_MAX}", classes.len()),
            });
        }
        for (index, class) in classes.iter().enumerate() {
            if class.name.is_empty() {
                return Err(TrajectoryError::Config {
                    field: "class.name",
                    message: format!("class {index} has an empty name"),
                });
            }
            if classes[..index]
                .iter()
                .any(|earlier| earlier.name == class.name)
            {
                return Err(TrajectoryError::Config {
                    field: "class.name",
                    message: format!("class name `{}` appears twice", class.name),
                });
            }
        }
        Ok(Self { classes })
    }

    /// The paper's eq (4) for Claude Code.
    pub fn claude_code() -> Self {
        let main = || AgentRule::Exactly("main".into());
        let sub = || AgentRule::AnyExcept("main".into());
        Self::new(vec![
            RoleClass {
                name: "main".into(),
                agent: main(),
                kind: Some(CallKind::Turn),
            },
            RoleClass {
                name: "main-summary".into(),
                agent: main(),
                kind: Some(CallKind::Summary),
            },
            RoleClass {
                name: "sub-agent".into(),
                agent: sub(),
                kind: Some(CallKind::Turn),
            },
            RoleClass {
                name: "sub-agent-summary".into(),
                agent: sub(),
                kind: Some(CallKind::Summary),
            },
        ])
        .expect("the built-in Claude Code classes are valid")
    }

    pub fn classes(&self) -> &[RoleClass] {
        &self.classes
    }

    pub fn len(&self) -> usize {
        self.classes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    pub fn name(&self, class: u32) -> &str {
        &self.classes[class as usize].name
    }

    /// The class of a leaf with this agent id and kind: the first matching rule.
    pub fn classify(&self, agent: &str, kind: CallKind) -> Option<u32> {
        // An abandoned attempt's partial output is audit data, never a training candidate,
        // whatever the harness's classes say.
        if kind == CallKind::Aborted {
            return None;
        }
        self.classes
            .iter()
            .position(|class| {
                class.agent.matches(agent) && class.kind.is_none_or(|wanted| wanted == kind)
            })
            .map(|index| index as u32)
    }
}

impl Default for RoleClasses {
    fn default() -> Self {
        Self::claude_code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_code_order() {
        let classes = RoleClasses::claude_code();
        assert_eq!(classes.classify("main", CallKind::Turn), Some(0));
        assert_eq!(classes.classify("main", CallKind::Summary), Some(1));
        assert_eq!(classes.classify("agent-7", CallKind::Turn), Some(2));
        assert_eq!(classes.classify("agent-7", CallKind::Summary), Some(3));
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let class = RoleClass {
            name: "x".into(),
            agent: AgentRule::Any,
            kind: None,
        };
        assert!(RoleClasses::new(vec![class.clone(), class]).is_err());
        assert!(RoleClasses::new(vec![]).is_err());
    }
}
