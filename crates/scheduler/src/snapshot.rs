//! The scheduler projection's snapshot encoding: every field of [`SchedulerState`], in a fixed
//! order, with `gyre_event::wire`.
//!
//! `gyre-state` frames this (magic, format version, checksum) together with the trajectory
//! buffer; a change here is a change of that format version. Maps and sets are written in their
//! `BTreeMap` order with increasing keys, so equal states give equal bytes and the decoder can
//! refuse duplicates and any other order. A map's key is not repeated inside its value (engine,
//! group ids): the decoder restores it from the key. Semantic invariants (`validate`) are not
//! checked on decode: a replica's state after refused events may not satisfy every one of them,
//! and a snapshot must restore exactly what was folded.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use gyre_event::wire::{Reader, WireError, WireErrorKind, Writer};
use gyre_event::{
    CellId, CloseStatus, Duration, EngineId, ExecutionId, GroupId, MicroStepId, PolicyVersion,
    QueryId, Role, RunConfig, SchedulingMode, StepId, Timestamp,
};

use crate::{
    BatchState, CellState, EngineState, ExecutionState, GroupState, MicroStepState, Resolution,
    SchedulerState, StalenessRecord,
};

fn mode_code(mode: SchedulingMode) -> u8 {
    match mode {
        SchedulingMode::Elastic => 0,
        SchedulingMode::Colocate => 1,
        SchedulingMode::Async => 2,
    }
}

fn role_code(role: Role) -> u8 {
    match role {
        Role::Rollout => 0,
        Role::Training => 1,
    }
}

fn close_status_code(status: CloseStatus) -> u8 {
    match status {
        CloseStatus::Completed => 0,
        CloseStatus::Failed => 1,
        CloseStatus::HarnessTimeout => 2,
        CloseStatus::OverallTimeout => 3,
        CloseStatus::Cancelled => 4,
        CloseStatus::Surplus => 5,
    }
}

fn resolution_code(resolution: Resolution) -> u8 {
    match resolution {
        Resolution::Pending => 0,
        Resolution::Valid => 1,
        Resolution::Dummy => 2,
        Resolution::Excluded => 3,
    }
}

/// Reads a one-byte enum code and maps it, naming the field on an unknown code.
fn read_code<T>(
    reader: &mut Reader<'_>,
    field: &'static str,
    decode: impl Fn(u8) -> Option<T>,
) -> Result<T, WireError> {
    let start = reader.offset();
    let code = reader.u8(field)?;
    decode(code).ok_or_else(|| {
        reader.error_at(start, field, WireErrorKind::UnknownTag { tag: code as u64 })
    })
}

fn read_mode(reader: &mut Reader<'_>, field: &'static str) -> Result<SchedulingMode, WireError> {
    read_code(reader, field, |code| match code {
        0 => Some(SchedulingMode::Elastic),
        1 => Some(SchedulingMode::Colocate),
        2 => Some(SchedulingMode::Async),
        _ => None,
    })
}

fn read_role(reader: &mut Reader<'_>, field: &'static str) -> Result<Role, WireError> {
    read_code(reader, field, |code| match code {
        0 => Some(Role::Rollout),
        1 => Some(Role::Training),
        _ => None,
    })
}

/// `None` as 0, a role as 1 + its code.
fn read_option_role(
    reader: &mut Reader<'_>,
    field: &'static str,
) -> Result<Option<Role>, WireError> {
    read_code(reader, field, |code| match code {
        0 => Some(None),
        1 => Some(Some(Role::Rollout)),
        2 => Some(Some(Role::Training)),
        _ => None,
    })
}

/// `None` as 0, a status as 1 + its code.
fn read_option_close_status(
    reader: &mut Reader<'_>,
    field: &'static str,
) -> Result<Option<CloseStatus>, WireError> {
    read_code(reader, field, |code| match code {
        0 => Some(None),
        code => CloseStatus::ALL
            .iter()
            .copied()
            .find(|status| close_status_code(*status) + 1 == code)
            .map(Some),
    })
}

fn read_resolution(reader: &mut Reader<'_>, field: &'static str) -> Result<Resolution, WireError> {
    read_code(reader, field, |code| match code {
        0 => Some(Resolution::Pending),
        1 => Some(Resolution::Valid),
        2 => Some(Resolution::Dummy),
        3 => Some(Resolution::Excluded),
        _ => None,
    })
}

fn read_option_u32(reader: &mut Reader<'_>, field: &'static str) -> Result<Option<u32>, WireError> {
    if reader.bool(field)? {
        Ok(Some(reader.u32(field)?))
    } else {
        Ok(None)
    }
}

fn write_option_u32(writer: &mut Writer, value: Option<u32>) {
    writer.option_varint(value.map(u64::from));
}

fn write_config(writer: &mut Writer, config: &RunConfig) {
    let RunConfig {
        run_seed,
        mode,
        streaming,
        phi,
        mu,
        n,
        b,
        steps,
        rho_min,
        tau,
        j_max,
        async_training_cells,
    } = config;
    writer.varint(*run_seed);
    writer.u8(mode_code(*mode));
    writer.bool(*streaming);
    writer.f64(*phi);
    writer.u32(*mu);
    writer.u32(*n);
    writer.u32(*b);
    writer.u32(*steps);
    writer.f64(*rho_min);
    writer.varint(tau.nanos());
    writer.u32(*j_max);
    writer.u32(*async_training_cells);
}

fn read_config(reader: &mut Reader<'_>) -> Result<RunConfig, WireError> {
    Ok(RunConfig {
        run_seed: reader.varint("scheduler.config.run_seed")?,
        mode: read_mode(reader, "scheduler.config.mode")?,
        streaming: reader.bool("scheduler.config.streaming")?,
        phi: reader.f64("scheduler.config.phi")?,
        mu: reader.u32("scheduler.config.mu")?,
        n: reader.u32("scheduler.config.n")?,
        b: reader.u32("scheduler.config.b")?,
        steps: reader.u32("scheduler.config.steps")?,
        rho_min: reader.f64("scheduler.config.rho_min")?,
        tau: Duration(reader.varint("scheduler.config.tau")?),
        j_max: reader.u32("scheduler.config.j_max")?,
        async_training_cells: reader.u32("scheduler.config.async_training_cells")?,
    })
}

fn write_cell(writer: &mut Writer, cell: &CellState) {
    let CellState {
        id,
        nodes,
        rollout_capacity,
        engine,
        role,
        switching_to,
        role_since,
    } = cell;
    writer.u32(id.get());
    writer.u32(*nodes);
    writer.u32(*rollout_capacity);
    writer.u32(engine.get());
    writer.u8(role_code(*role));
    writer.u8(switching_to.map_or(0, |to| 1 + role_code(to)));
    writer.varint(role_since.nanos());
}

fn read_cell(reader: &mut Reader<'_>) -> Result<CellState, WireError> {
    Ok(CellState {
        id: CellId(reader.u32("scheduler.cells.id")?),
        nodes: reader.u32("scheduler.cells.nodes")?,
        rollout_capacity: reader.u32("scheduler.cells.rollout_capacity")?,
        engine: EngineId(reader.u32("scheduler.cells.engine")?),
        role: read_role(reader, "scheduler.cells.role")?,
        switching_to: read_option_role(reader, "scheduler.cells.switching_to")?,
        role_since: Timestamp(reader.varint("scheduler.cells.role_since")?),
    })
}

fn write_engine(writer: &mut Writer, engine: &EngineState) {
    let EngineState {
        id: _,
        capacity,
        cell,
        ready,
        accepting,
        running,
    } = engine;
    writer.u32(*capacity);
    write_option_u32(writer, cell.map(CellId::get));
    writer.bool(*ready);
    writer.bool(*accepting);
    writer.count(running.len());
    let mut previous = None;
    for execution in running {
        writer.increasing(previous, execution.get());
        previous = Some(execution.get());
    }
}

fn read_engine(reader: &mut Reader<'_>, id: EngineId) -> Result<EngineState, WireError> {
    let capacity = reader.u32("scheduler.engines.capacity")?;
    let cell = read_option_u32(reader, "scheduler.engines.cell")?.map(CellId);
    let ready = reader.bool("scheduler.engines.ready")?;
    let accepting = reader.bool("scheduler.engines.accepting")?;
    let count = reader.count("scheduler.engines.running", 1)?;
    let mut running = BTreeSet::new();
    let mut previous = None;
    for _ in 0..count {
        let execution = reader.increasing("scheduler.engines.running", previous)?;
        running.insert(ExecutionId(execution));
        previous = Some(execution);
    }
    Ok(EngineState {
        id,
        capacity,
        cell,
        ready,
        accepting,
        running,
    })
}

fn write_group(writer: &mut Writer, group: &GroupState) {
    let GroupState {
        id: _,
        query,
        dispatched_version,
        size,
        started,
        closed,
        resolved,
        packed_into,
    } = group;
    writer.varint(query.get());
    writer.varint(dispatched_version.get());
    writer.u32(*size);
    writer.u32(*started);
    writer.u32(*closed);
    writer.u32(*resolved);
    writer.option_varint(packed_into.map(StepId::get));
}

fn read_group(reader: &mut Reader<'_>, id: GroupId) -> Result<GroupState, WireError> {
    Ok(GroupState {
        id,
        query: QueryId(reader.varint("scheduler.groups.query")?),
        dispatched_version: PolicyVersion(reader.varint("scheduler.groups.dispatched_version")?),
        size: reader.u32("scheduler.groups.size")?,
        started: reader.u32("scheduler.groups.started")?,
        closed: reader.u32("scheduler.groups.closed")?,
        resolved: reader.u32("scheduler.groups.resolved")?,
        packed_into: reader
            .option_varint("scheduler.groups.packed_into")?
            .map(StepId),
    })
}

fn write_execution(writer: &mut Writer, execution: &ExecutionState) {
    let ExecutionState {
        group,
        engine,
        closed,
        resolution,
    } = execution;
    writer.varint(group.get());
    write_option_u32(writer, engine.map(EngineId::get));
    writer.u8(closed.map_or(0, |status| 1 + close_status_code(status)));
    writer.u8(resolution_code(*resolution));
}

fn read_execution(reader: &mut Reader<'_>) -> Result<ExecutionState, WireError> {
    Ok(ExecutionState {
        group: GroupId(reader.varint("scheduler.executions.group")?),
        engine: read_option_u32(reader, "scheduler.executions.engine")?.map(EngineId),
        closed: read_option_close_status(reader, "scheduler.executions.closed")?,
        resolution: read_resolution(reader, "scheduler.executions.resolution")?,
    })
}

fn write_batch(writer: &mut Writer, batch: &BatchState) {
    let BatchState {
        step,
        opened_at,
        groups,
        micro_steps,
        group_claims,
        claimed_count,
        stream_closed,
        join_window_closed,
        participants,
    } = batch;
    writer.varint(step.get());
    writer.varint(opened_at.nanos());
    writer.count(groups.len());
    for group in groups {
        writer.varint(group.get());
    }
    writer.count(micro_steps.len());
    let mut previous = None;
    for (id, micro_step) in micro_steps {
        let MicroStepState {
            group,
            claimed_by,
            done,
        } = micro_step;
        writer.increasing(previous, id.get());
        previous = Some(id.get());
        writer.varint(group.get());
        write_option_u32(writer, claimed_by.map(CellId::get));
        writer.bool(*done);
    }
    writer.count(group_claims.len());
    let mut previous = None;
    for (group, (enqueued, claimed)) in group_claims {
        writer.increasing(previous, group.get());
        previous = Some(group.get());
        writer.u32(*enqueued);
        writer.u32(*claimed);
    }
    writer.u32(*claimed_count);
    writer.bool(*stream_closed);
    writer.bool(*join_window_closed);
    writer.count(participants.len());
    let mut previous = None;
    for cell in participants {
        writer.increasing(previous, cell.get() as u64);
        previous = Some(cell.get() as u64);
    }
}

fn read_increasing_u32(
    reader: &mut Reader<'_>,
    field: &'static str,
    previous: Option<u64>,
) -> Result<u32, WireError> {
    let start = reader.offset();
    let value = reader.increasing(field, previous)?;
    u32::try_from(value).map_err(|_| {
        reader.error_at(
            start,
            field,
            WireErrorKind::OutOfRange {
                value,
                max: u32::MAX as u64,
            },
        )
    })
}

fn read_batch(reader: &mut Reader<'_>) -> Result<BatchState, WireError> {
    let step = StepId(reader.varint("scheduler.batch.step")?);
    let opened_at = Timestamp(reader.varint("scheduler.batch.opened_at")?);
    let count = reader.count("scheduler.batch.groups", 1)?;
    let mut groups = Vec::with_capacity(count);
    for _ in 0..count {
        groups.push(GroupId(reader.varint("scheduler.batch.groups")?));
    }
    let count = reader.count("scheduler.batch.micro_steps", 4)?;
    let mut micro_steps = BTreeMap::new();
    let mut previous = None;
    for _ in 0..count {
        let id = reader.increasing("scheduler.batch.micro_steps.id", previous)?;
        previous = Some(id);
        let state = MicroStepState {
            group: GroupId(reader.varint("scheduler.batch.micro_steps.group")?),
            claimed_by: read_option_u32(reader, "scheduler.batch.micro_steps.claimed_by")?
                .map(CellId),
            done: reader.bool("scheduler.batch.micro_steps.done")?,
        };
        micro_steps.insert(MicroStepId(id), state);
    }
    let count = reader.count("scheduler.batch.group_claims", 3)?;
    let mut group_claims = BTreeMap::new();
    let mut previous = None;
    for _ in 0..count {
        let group = reader.increasing("scheduler.batch.group_claims.group", previous)?;
        previous = Some(group);
        let enqueued = reader.u32("scheduler.batch.group_claims.enqueued")?;
        let claimed = reader.u32("scheduler.batch.group_claims.claimed")?;
        group_claims.insert(GroupId(group), (enqueued, claimed));
    }
    let claimed_count = reader.u32("scheduler.batch.claimed_count")?;
    let stream_closed = reader.bool("scheduler.batch.stream_closed")?;
    let join_window_closed = reader.bool("scheduler.batch.join_window_closed")?;
    let count = reader.count("scheduler.batch.participants", 1)?;
    let mut participants = BTreeSet::new();
    let mut previous = None;
    for _ in 0..count {
        let cell = read_increasing_u32(reader, "scheduler.batch.participants", previous)?;
        previous = Some(cell as u64);
        participants.insert(CellId(cell));
    }
    Ok(BatchState {
        step,
        opened_at,
        groups,
        micro_steps,
        group_claims,
        claimed_count,
        stream_closed,
        join_window_closed,
        participants,
    })
}

impl SchedulerState {
    /// Appends the canonical snapshot encoding of the whole projection.
    pub fn encode_into(&self, writer: &mut Writer) {
        // Destructured so that a new field cannot be forgotten here.
        let SchedulerState {
            config,
            now,
            events_applied,
            cells,
            engines,
            dispatched,
            started,
            finished,
            groups,
            executions,
            start_queue,
            ready_unpacked,
            next_group,
            next_execution,
            next_micro_step,
            dispatch_owed_groups,
            initial_dispatch_done,
            core_decision_pending,
            training_version,
            published_version,
            burst,
            steps_in_burst,
            burst_end_pending,
            awaiting_publish,
            batch,
            supply_ok_since,
            staleness,
            rejected_claims,
            run_complete,
        } = self;
        writer.bool(config.is_some());
        if let Some(config) = config {
            write_config(writer, config);
        }
        writer.varint(now.nanos());
        writer.varint(*events_applied);
        writer.count(cells.len());
        for cell in cells {
            write_cell(writer, cell);
        }
        writer.count(engines.len());
        let mut previous = None;
        for (id, engine) in engines {
            writer.increasing(previous, id.get() as u64);
            previous = Some(id.get() as u64);
            write_engine(writer, engine);
        }
        writer.varint(*dispatched);
        writer.varint(*started);
        writer.varint(*finished);
        writer.count(groups.len());
        let mut previous = None;
        for (id, group) in groups {
            writer.increasing(previous, id.get());
            previous = Some(id.get());
            write_group(writer, group);
        }
        writer.count(executions.len());
        let mut previous = None;
        for (id, execution) in executions {
            writer.increasing(previous, id.get());
            previous = Some(id.get());
            write_execution(writer, execution);
        }
        writer.count(start_queue.len());
        for group in start_queue {
            writer.varint(group.get());
        }
        writer.count(ready_unpacked.len());
        for (version, group) in ready_unpacked {
            writer.varint(version.get());
            writer.varint(group.get());
        }
        writer.varint(*next_group);
        writer.varint(*next_execution);
        writer.varint(*next_micro_step);
        writer.varint(*dispatch_owed_groups);
        writer.bool(*initial_dispatch_done);
        writer.bool(*core_decision_pending);
        writer.varint(training_version.get());
        writer.varint(published_version.get());
        writer.varint(*burst);
        writer.u32(*steps_in_burst);
        writer.bool(*burst_end_pending);
        writer.bool(*awaiting_publish);
        writer.bool(batch.is_some());
        if let Some(batch) = batch {
            write_batch(writer, batch);
        }
        writer.option_varint(supply_ok_since.map(Timestamp::nanos));
        writer.count(staleness.len());
        for record in staleness {
            let StalenessRecord {
                step,
                group,
                staleness,
            } = record;
            writer.varint(step.get());
            writer.varint(group.get());
            writer.varint(*staleness);
        }
        writer.varint(*rejected_claims);
        writer.bool(*run_complete);
    }

    /// Reads what [`SchedulerState::encode_into`] wrote. Never panics; refuses non-canonical
    /// bytes (unsorted or repeated keys, unknown tags, non-minimal varints).
    pub fn decode_from(reader: &mut Reader<'_>) -> Result<SchedulerState, WireError> {
        let config = if reader.bool("scheduler.config")? {
            Some(read_config(reader)?)
        } else {
            None
        };
        let now = Timestamp(reader.varint("scheduler.now")?);
        let events_applied = reader.varint("scheduler.events_applied")?;
        let count = reader.count("scheduler.cells", 7)?;
        let mut cells = Vec::with_capacity(count);
        for _ in 0..count {
            cells.push(read_cell(reader)?);
        }
        let count = reader.count("scheduler.engines", 6)?;
        let mut engines = BTreeMap::new();
        let mut previous = None;
        for _ in 0..count {
            let id = EngineId(read_increasing_u32(
                reader,
                "scheduler.engines.id",
                previous,
            )?);
            previous = Some(id.get() as u64);
            engines.insert(id, read_engine(reader, id)?);
        }
        let dispatched = reader.varint("scheduler.dispatched")?;
        let started = reader.varint("scheduler.started")?;
        let finished = reader.varint("scheduler.finished")?;
        let count = reader.count("scheduler.groups", 8)?;
        let mut groups = BTreeMap::new();
        let mut previous = None;
        for _ in 0..count {
            let id = GroupId(reader.increasing("scheduler.groups.id", previous)?);
            previous = Some(id.get());
            groups.insert(id, read_group(reader, id)?);
        }
        let count = reader.count("scheduler.executions", 5)?;
        let mut executions = BTreeMap::new();
        let mut previous = None;
        for _ in 0..count {
            let id = ExecutionId(reader.increasing("scheduler.executions.id", previous)?);
            previous = Some(id.get());
            executions.insert(id, read_execution(reader)?);
        }
        let count = reader.count("scheduler.start_queue", 1)?;
        let mut start_queue = VecDeque::with_capacity(count);
        for _ in 0..count {
            start_queue.push_back(GroupId(reader.varint("scheduler.start_queue")?));
        }
        let count = reader.count("scheduler.ready_unpacked", 2)?;
        let mut ready_unpacked = BTreeSet::new();
        let mut previous = None;
        for _ in 0..count {
            let start = reader.offset();
            let version = PolicyVersion(reader.varint("scheduler.ready_unpacked.version")?);
            let group = GroupId(reader.varint("scheduler.ready_unpacked.group")?);
            if previous.is_some_and(|previous| previous >= (version, group)) {
                return Err(reader.error_at(
                    start,
                    "scheduler.ready_unpacked",
                    WireErrorKind::NotIncreasing,
                ));
            }
            previous = Some((version, group));
            ready_unpacked.insert((version, group));
        }
        let next_group = reader.varint("scheduler.next_group")?;
        let next_execution = reader.varint("scheduler.next_execution")?;
        let next_micro_step = reader.varint("scheduler.next_micro_step")?;
        let dispatch_owed_groups = reader.varint("scheduler.dispatch_owed_groups")?;
        let initial_dispatch_done = reader.bool("scheduler.initial_dispatch_done")?;
        let core_decision_pending = reader.bool("scheduler.core_decision_pending")?;
        let training_version = PolicyVersion(reader.varint("scheduler.training_version")?);
        let published_version = PolicyVersion(reader.varint("scheduler.published_version")?);
        let burst = reader.varint("scheduler.burst")?;
        let steps_in_burst = reader.u32("scheduler.steps_in_burst")?;
        let burst_end_pending = reader.bool("scheduler.burst_end_pending")?;
        let awaiting_publish = reader.bool("scheduler.awaiting_publish")?;
        let batch = if reader.bool("scheduler.batch")? {
            Some(read_batch(reader)?)
        } else {
            None
        };
        let supply_ok_since = reader
            .option_varint("scheduler.supply_ok_since")?
            .map(Timestamp);
        let count = reader.count("scheduler.staleness", 3)?;
        let mut staleness = Vec::with_capacity(count);
        for _ in 0..count {
            staleness.push(StalenessRecord {
                step: StepId(reader.varint("scheduler.staleness.step")?),
                group: GroupId(reader.varint("scheduler.staleness.group")?),
                staleness: reader.varint("scheduler.staleness.staleness")?,
            });
        }
        let rejected_claims = reader.varint("scheduler.rejected_claims")?;
        let run_complete = reader.bool("scheduler.run_complete")?;
        Ok(SchedulerState {
            config,
            now,
            events_applied,
            cells,
            engines,
            dispatched,
            started,
            finished,
            groups,
            executions,
            start_queue,
            ready_unpacked,
            next_group,
            next_execution,
            next_micro_step,
            dispatch_owed_groups,
            initial_dispatch_done,
            core_decision_pending,
            training_version,
            published_version,
            burst,
            steps_in_burst,
            burst_end_pending,
            awaiting_publish,
            batch,
            supply_ok_since,
            staleness,
            rejected_claims,
            run_complete,
        })
    }
}
