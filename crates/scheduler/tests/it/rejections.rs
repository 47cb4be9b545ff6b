//! Nonsense is refused: `apply` returns an error and leaves the projection (and its digest)
//! unchanged, which the harness asserts for every rejected line. A duplicate micro-step claim is
//! not an error but a recorded no-op: the first committed claim wins.

use expect_test::expect;

use crate::harness::check;

/// A setup shared by the scripts below: cell0 training on step 0 with g0 and g1 packed (one
/// micro-step each), cell1 still in rollout, e2..e3 running on the standalone pool.
const SETUP: &str =
    "config mode=elastic phi=1 mu=1 n=1 b=2 rho_min=0.5 tau=0 cells=2x2 standalone=2
     at 0 decide
     at 10 finish e0-e1
     at 10 decide
     at 11 complete cell0 training
     at 11 pack";

fn with_setup(script: &str) -> String {
    format!("{SETUP}\n{script}")
}

#[test]
fn unknown_execution_claim_by_rollout_cell_and_early_optimizer_step_are_rejected() {
    check(
        &with_setup(
            "at 12 close e99 completed
             at 12 claim cell1 ms0
             at 12 claim cell0 ms0
             at 12 optimizer
             at 12 done ms1 cell0
             at 12 state",
        ),
        expect![[r#"
            at 0 decide
              dispatch 4 groups g0..g3 (4 executions, v_d=0)
              open step0
              start 4: engine100[e0..e1] engine1[e2..e3]
              = d=4 p=4 f=0 w=4 C_R=6 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:0/2 1:2/2 100:2/2] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              begin cell0 -> training
              = d=4 p=4 f=2 w=2 C_R=4 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R] engines=[0:0/2x 1:2/2 100:0/2] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=10 wakeup=-
            at 12 close e99 completed
              rejected: unknown execution e99 (state unchanged)
            at 12 claim cell1 ms0
              rejected: cell1 is not in training role (state unchanged)
            at 12 optimizer
              rejected: optimizer step for step0 before all micro-steps were done (state unchanged)
            at 12 done ms1 cell0
              rejected: micro-step ms1 is not claimed by cell0 (state unchanged)
            at 12 state
              = d=4 p=4 f=2 w=2 C_R=4 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R] engines=[0:0/2! 1:2/2 100:0/2] ready=[] batch=step0{g0,g1 ms=2 claimed=1 done=0 stream-closed} supply=1/1 since=11 wakeup=-
        "#]],
    );
}

#[test]
fn duplicate_micro_step_claim_is_a_recorded_no_op() {
    check(
        &with_setup(
            "at 12 claim cell0 ms0
             at 12 decide
             at 13 complete cell1 training
             at 13 claim cell1 ms0
             at 13 done ms0 cell1
             at 13 claim cell1 ms1
             at 14 done-all
             at 14 decide",
        ),
        expect![[r#"
            at 0 decide
              dispatch 4 groups g0..g3 (4 executions, v_d=0)
              open step0
              start 4: engine100[e0..e1] engine1[e2..e3]
              = d=4 p=4 f=0 w=4 C_R=6 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:0/2 1:2/2 100:2/2] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              begin cell0 -> training
              = d=4 p=4 f=2 w=2 C_R=4 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R] engines=[0:0/2x 1:2/2 100:0/2] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=10 wakeup=-
            at 12 decide
              begin cell1 -> training
              routes from engine1: e2..e3->engine100
              = d=4 p=4 f=2 w=2 C_R=2 k=2 v_t=0 v_pub=0 burst=0.0
                roles=[T R>T] engines=[0:0/2! 1:0/2x 100:2/2] ready=[] batch=step0{g0,g1 ms=2 claimed=1 done=0 stream-closed} supply=1/1 since=11 wakeup=-
            at 13 claim cell1 ms0
              ms0 already claimed by cell0: recorded no-op (rejected_claims=1)
            at 13 done ms0 cell1
              rejected: micro-step ms0 is not claimed by cell1 (state unchanged)
            at 14 decide
              join-window-closed step0
              = d=4 p=4 f=2 w=2 C_R=2 k=2 v_t=0 v_pub=0 burst=0.0
                roles=[T T] engines=[0:0/2! 1:0/2! 100:2/2] ready=[] batch=step0{g0,g1 ms=2 claimed=2 done=2 stream-closed window-closed} supply=0/1 since=- wakeup=-
        "#]],
    );
}

#[test]
fn other_nonsense_is_rejected() {
    check(
        &with_setup(
            "at 12 close e0 completed
             at 12 begin cell0 training
             at 12 complete cell1 training
             at 12 begin cell0 rollout
             at 12 begin cell0 rollout
             at 12 publish
             at 12 engine-down engine7
             at 12 claim cell5 ms0
             at 12 claim cell0 ms42
             at 12 state",
        ),
        expect![[r#"
            at 0 decide
              dispatch 4 groups g0..g3 (4 executions, v_d=0)
              open step0
              start 4: engine100[e0..e1] engine1[e2..e3]
              = d=4 p=4 f=0 w=4 C_R=6 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:0/2 1:2/2 100:2/2] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              begin cell0 -> training
              = d=4 p=4 f=2 w=2 C_R=4 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R] engines=[0:0/2x 1:2/2 100:0/2] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=10 wakeup=-
            at 12 close e0 completed
              rejected: execution e0 already closed (state unchanged)
            at 12 begin cell0 training
              rejected: transition of cell0 conflicts with its current role or another transition (state unchanged)
            at 12 complete cell1 training
              rejected: transition of cell1 conflicts with its current role or another transition (state unchanged)
            at 12 begin cell0 rollout
              rejected: transition of cell0 conflicts with its current role or another transition (state unchanged)
            at 12 publish
              rejected: published v0 but no burst has ended awaiting a publish (state unchanged)
            at 12 engine-down engine7
              rejected: unknown engine engine7 (state unchanged)
            at 12 claim cell5 ms0
              rejected: unknown cell cell5 (state unchanged)
            at 12 claim cell0 ms42
              rejected: unknown micro-step ms42 (state unchanged)
            at 12 state
              = d=4 p=4 f=2 w=2 C_R=4 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T>R R] engines=[0:0/2! 1:2/2 100:0/2] ready=[] batch=step0{g0,g1 ms=2 claimed=0 done=0 stream-closed} supply=2/1 since=11 wakeup=-
        "#]],
    );
}
