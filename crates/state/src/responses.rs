//! The stored-responses projection: every `ResponseStored` event of each open execution, so a
//! restarted proxy can resolve a `previous_response_id` it handed out before it died.
//!
//! Each record holds only what its response added to the conversation of the one it continues,
//! so an execution holds its conversations once. An execution's records are dropped when it
//! closes (it takes no more calls, so nothing can continue them).
//!
//! Fold rules: a record needs a non-empty id; a record naming a previous response needs that
//! response stored in the same execution; a record for a closed execution is refused; the same
//! record committed twice (a retried append whose first answer was lost) is a no-op, another
//! record under a held id is refused.
//!
//! Pure: no IO, no clock.

use std::collections::BTreeMap;

use gyre_event::wire::{Reader, WireError, Writer};
use gyre_event::{ExecutionId, StoredResponseRecord};

/// One execution's stored responses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExecutionResponses {
    /// In commit order.
    pub records: Vec<StoredResponseRecord>,
    /// Response id → position in `records` (derived; not encoded).
    by_id: BTreeMap<String, usize>,
}

impl ExecutionResponses {
    pub fn get(&self, id: &str) -> Option<&StoredResponseRecord> {
        self.by_id.get(id).map(|at| &self.records[*at])
    }

    /// Bytes of stored items.
    pub fn item_bytes(&self) -> usize {
        self.records.iter().map(|record| record.items.len()).sum()
    }

    fn push(&mut self, record: StoredResponseRecord) {
        self.by_id
            .insert(record.response_id.clone(), self.records.len());
        self.records.push(record);
    }
}

/// Stored responses of the open executions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredResponses {
    pub executions: BTreeMap<ExecutionId, ExecutionResponses>,
}

impl StoredResponses {
    pub fn is_empty(&self) -> bool {
        self.executions.is_empty()
    }

    /// Folds one `ResponseStored`; `closed` says whether its execution is closed.
    pub fn apply(&mut self, record: &StoredResponseRecord, closed: bool) -> Result<(), String> {
        let execution = record.execution;
        if record.response_id.is_empty() {
            return Err(format!(
                "execution {execution}: a stored response needs an id"
            ));
        }
        if closed {
            return Err(format!(
                "execution {execution} is closed: response {} cannot be stored",
                record.response_id
            ));
        }
        let held = self.executions.entry(execution).or_default();
        if let Some(existing) = held.get(&record.response_id) {
            if existing == record {
                return Ok(());
            }
            return Err(format!(
                "execution {execution}: response {} is already stored with other items",
                record.response_id
            ));
        }
        if let Some(previous) = &record.previous_response_id {
            if held.get(previous).is_none() {
                let error = format!(
                    "execution {execution}: response {} continues {previous}, which is not stored",
                    record.response_id
                );
                if held.records.is_empty() {
                    self.executions.remove(&execution);
                }
                return Err(error);
            }
        }
        held.push(record.clone());
        Ok(())
    }

    /// An execution closed: nothing can continue its responses.
    pub fn close(&mut self, execution: ExecutionId) {
        self.executions.remove(&execution);
    }

    /// Canonical encoding (snapshot format 4 and later).
    pub fn encode_into(&self, writer: &mut Writer) {
        writer.count(self.executions.len());
        for (execution, held) in &self.executions {
            writer.varint(execution.get());
            writer.count(held.records.len());
            for record in &held.records {
                writer.str(&record.response_id);
                match &record.previous_response_id {
                    Some(previous) => {
                        writer.bool(true);
                        writer.str(previous);
                    }
                    None => writer.bool(false),
                }
                writer.bytes(&record.items);
            }
        }
    }

    pub fn decode_from(reader: &mut Reader<'_>) -> Result<StoredResponses, WireError> {
        let mut out = StoredResponses::default();
        let executions = reader.count("responses.executions", 2)?;
        for _ in 0..executions {
            let execution = ExecutionId(reader.varint("responses.execution")?);
            let count = reader.count("responses.records", 3)?;
            let mut held = ExecutionResponses::default();
            for _ in 0..count {
                let response_id = reader.string("responses.response_id")?;
                let previous_response_id = if reader.bool("responses.has_previous")? {
                    Some(reader.string("responses.previous_response_id")?)
                } else {
                    None
                };
                let items = reader.bytes("responses.items")?.to_vec();
                held.push(StoredResponseRecord {
                    execution,
                    response_id,
                    previous_response_id,
                    items,
                });
            }
            out.executions.insert(execution, held);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, previous: Option<&str>, items: &str) -> StoredResponseRecord {
        StoredResponseRecord {
            execution: ExecutionId(7),
            response_id: id.into(),
            previous_response_id: previous.map(str::to_string),
            items: items.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_chain_folds_and_a_retry_is_a_no_op() {
        let mut responses = StoredResponses::default();
        responses
            .apply(&record("resp_1", None, r#"{"a":1}"#), false)
            .expect("root");
        responses
            .apply(&record("resp_2", Some("resp_1"), r#"{"b":2}"#), false)
            .expect("child");
        responses
            .apply(&record("resp_2", Some("resp_1"), r#"{"b":2}"#), false)
            .expect("the same record again");
        let held = &responses.executions[&ExecutionId(7)];
        assert_eq!(held.records.len(), 2);
        assert_eq!(held.item_bytes(), 14);
        let error = responses
            .apply(&record("resp_2", Some("resp_1"), r#"{"c":3}"#), false)
            .expect_err("other items");
        assert!(error.contains("already stored with other items"), "{error}");
    }

    #[test]
    fn an_unknown_parent_an_empty_id_and_a_closed_execution_are_refused() {
        let mut responses = StoredResponses::default();
        let error = responses
            .apply(&record("resp_2", Some("resp_1"), ""), false)
            .expect_err("no parent");
        assert!(
            error.contains("continues resp_1, which is not stored"),
            "{error}"
        );
        assert!(responses.is_empty(), "a refusal leaves nothing behind");
        let error = responses
            .apply(&record("", None, ""), false)
            .expect_err("no id");
        assert!(error.contains("needs an id"), "{error}");
        let error = responses
            .apply(&record("resp_1", None, ""), true)
            .expect_err("closed");
        assert!(error.contains("is closed"), "{error}");
    }

    #[test]
    fn the_encoding_round_trips_and_closing_drops_an_execution() {
        let mut responses = StoredResponses::default();
        responses
            .apply(&record("resp_1", None, r#"{"a":1}"#), false)
            .expect("root");
        responses
            .apply(&record("resp_2", Some("resp_1"), ""), false)
            .expect("child");
        let mut writer = Writer::new();
        responses.encode_into(&mut writer);
        let bytes = writer.into_bytes();
        let mut reader = Reader::new(&bytes);
        let decoded = StoredResponses::decode_from(&mut reader).expect("decode");
        reader.finish("end").expect("all read");
        assert_eq!(decoded, responses);
        assert_eq!(
            decoded.executions[&ExecutionId(7)]
                .get("resp_2")
                .and_then(|r| r.previous_response_id.as_deref()),
            Some("resp_1")
        );
        responses.close(ExecutionId(7));
        assert!(responses.is_empty());
    }
}
