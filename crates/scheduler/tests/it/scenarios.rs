//! One scripted scenario per scheduling rule of DESIGN.md §4 (tests as data, STYLE rule 10).
//!
//! Each snapshot was read against the rule it names; the comments in the scripts say what the
//! rule demands, so a reader can check the dump without running anything. Engines: cell i runs
//! `engine<i>`, the standalone pool is `engine100`. In the dump, `R>T` is a cell switching to
//! training, `T>R` one switching back, `x` an engine that is up but not accepting, `!` one that is
//! not ready.

use expect_test::expect;

use crate::harness::check;

/// Boundary dispatch at the start: (φ+μ)·B groups of N, i.e. (0.5+3)·2 = 7 groups, 14 executions.
/// They start standalone-first, then on rollout cells in descending index.
#[test]
fn initial_dispatch_is_phi_plus_mu_times_b_groups() {
    check(
        "config mode=elastic phi=0.5 mu=3 n=2 b=2 rho_min=0.5 tau=10 cells=3x4 standalone=4
         at 0 decide",
        expect![[r#"
            at 0 decide
              dispatch 7 groups g0..g6 (14 executions, v_d=0)
              open step0
              start 14: engine100[e0..e3] engine2[e4..e7] engine1[e8..e11] engine0[e12..e13]
              = d=14 p=14 f=0 w=14 C_R=16 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R R] engines=[0:2/4 1:4/4 2:4/4 100:4/4] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
        "#]],
    );
}

/// After each publish μ·B more groups are dispatched (here 2), and d stays fixed inside a burst:
/// it is 2 through both optimizer steps of burst 0 and becomes 4 only after the publish.
#[test]
fn mu_times_b_after_each_publish_and_d_fixed_within_a_burst() {
    check(
        "config mode=elastic phi=0 mu=2 n=1 b=1 rho_min=1 tau=0 cells=2x2
         at 0 decide
         at 10 finish e0
         at 10 decide
         at 11 complete cell0 training
         at 11 pack
         at 11 claim-all cell0
         at 12 done-all
         at 12 decide
         at 13 optimizer
         at 13 decide
         at 20 finish e1
         at 20 pack
         at 20 claim-all cell0
         at 21 done-all
         at 21 decide
         at 22 optimizer
         at 22 decide
         at 30 publish
         at 30 decide",
        expect![[r#"
            at 0 decide
              dispatch 2 groups g0..g1 (2 executions, v_d=0)
              open step0
              start 2: engine1[e0..e1]
              = d=2 p=2 f=0 w=2 C_R=4 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:0/2 1:2/2] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              begin cell0 -> training
              = d=2 p=2 f=1 w=1 C_R=2 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R] engines=[0:0/2x 1:1/2] ready=[g0] batch=step0{none ms=0 claimed=0 done=0} supply=1/1 since=10 wakeup=-
            at 12 decide
              join-window-closed step0
              = d=2 p=2 f=1 w=1 C_R=2 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R] engines=[0:0/2! 1:1/2] ready=[] batch=step0{g0 ms=1 claimed=1 done=1 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 13 optimizer
              step0 -> v1 consumed g0:d=0
            at 13 decide
              open step1
              = d=2 p=2 f=1 w=1 C_R=2 k=1 v_t=1 v_pub=0 burst=0.1
                roles=[T R] engines=[0:0/2! 1:1/2] ready=[] batch=step1{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 21 decide
              join-window-closed step1
              = d=2 p=2 f=2 w=0 C_R=2 k=1 v_t=1 v_pub=0 burst=0.1
                roles=[T R] engines=[0:0/2! 1:0/2] ready=[] batch=step1{g1 ms=1 claimed=1 done=1 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 22 optimizer
              step1 -> v2 consumed g1:d=1
            at 22 decide
              burst-ended 0
              = d=2 p=2 f=2 w=0 C_R=2 k=1 v_t=2 v_pub=0 burst=1.0 awaiting-publish
                roles=[T R] engines=[0:0/2! 1:0/2] ready=[] batch=- supply=0/1 since=- wakeup=-
            at 30 decide
              begin cell0 -> rollout
              dispatch 2 groups g2..g3 (2 executions, v_d=2)
              open step2
              start 2: engine1[e2..e3]
              = d=4 p=4 f=2 w=2 C_R=2 k=1 v_t=2 v_pub=2 burst=1.0
                roles=[T>R R] engines=[0:0/2! 1:2/2] ready=[] batch=step2{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
        "#]],
    );
}

/// Start rule: start min(d − p, C_R − (p − f)) queued executions. First capacity binds
/// (8 queued, C_R = 5), then capacity again (3 queued, 2 free slots), then the queue (1 queued,
/// 3 free slots).
#[test]
fn start_rule_is_bound_by_capacity_then_by_the_queue() {
    check(
        "config mode=elastic phi=1 mu=1 n=2 b=2 rho_min=1 tau=10 cells=2x2 standalone=1
         at 0 decide
         at 10 finish e0-e1
         at 10 decide
         at 20 finish e2-e4
         at 20 decide",
        expect![[r#"
            at 0 decide
              dispatch 4 groups g0..g3 (8 executions, v_d=0)
              open step0
              start 5: engine100[e0] engine1[e1..e2] engine0[e3..e4]
              = d=8 p=5 f=0 w=8 C_R=5 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:2/2 1:2/2 100:1/1] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/2 since=- wakeup=-
            at 10 decide
              start 2: engine100[e5] engine1[e6]
              = d=8 p=7 f=2 w=6 C_R=5 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:2/2 1:2/2 100:1/1] ready=[g0] batch=step0{none ms=0 claimed=0 done=0} supply=1/2 since=- wakeup=-
            at 20 decide
              start 1: engine1[e7]
              = d=8 p=8 f=5 w=3 C_R=5 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:0/2 1:2/2 100:1/1] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/2 since=20 wakeup=30
        "#]],
    );
}

/// eq (1): C_R = C_s + (K − k)·C_e with C_s = 4, C_e = 4, K = 3: 16, 12, 8 as cells leave rollout
/// (switching counts as out of rollout), back to 12 and 16 as they return.
#[test]
fn eq1_rollout_capacity_follows_the_cells_in_rollout() {
    check(
        "config mode=elastic phi=0 mu=1 n=1 b=2 rho_min=0.5 tau=0 cells=3x4 standalone=4
         at 0 decide
         at 10 finish e0-e1
         at 10 decide
         at 11 complete cell0 training
         at 11 pack
         at 11 claim cell0
         at 11 decide
         at 12 complete cell1 training
         at 12 claim cell1
         at 13 done-all
         at 13 decide
         at 14 optimizer
         at 14 decide
         at 15 complete cell1 rollout
         at 15 state
         at 20 publish
         at 20 decide
         at 21 complete cell0 rollout
         at 21 decide",
        expect![[r#"
            at 0 decide
              dispatch 2 groups g0..g1 (2 executions, v_d=0)
              open step0
              start 2: engine100[e0..e1]
              = d=2 p=2 f=0 w=2 C_R=16 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R R] engines=[0:0/4 1:0/4 2:0/4 100:2/4] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              begin cell0 -> training
              = d=2 p=2 f=2 w=0 C_R=12 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R R] engines=[0:0/4x 1:0/4 2:0/4 100:0/4] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=10 wakeup=-
            at 11 decide
              begin cell1 -> training
              = d=2 p=2 f=2 w=0 C_R=8 k=2 v_t=0 v_pub=0 burst=0.0
                roles=[T R>T R] engines=[0:0/4! 1:0/4x 2:0/4 100:0/4] ready=[] batch=step0{g0,g1 ms=2 claimed=1 done=0 stream-closed} supply=1/1 since=11 wakeup=-
            at 13 decide
              join-window-closed step0
              = d=2 p=2 f=2 w=0 C_R=8 k=2 v_t=0 v_pub=0 burst=0.0
                roles=[T T R] engines=[0:0/4! 1:0/4! 2:0/4 100:0/4] ready=[] batch=step0{g0,g1 ms=2 claimed=2 done=2 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 14 optimizer
              step0 -> v1 consumed g0:d=0 g1:d=0
            at 14 decide
              burst-ended 0
              begin cell1 -> rollout
              = d=2 p=2 f=2 w=0 C_R=8 k=2 v_t=1 v_pub=0 burst=1.0 awaiting-publish
                roles=[T T>R R] engines=[0:0/4! 1:0/4! 2:0/4 100:0/4] ready=[] batch=- supply=0/1 since=- wakeup=-
            at 15 state
              = d=2 p=2 f=2 w=0 C_R=12 k=1 v_t=1 v_pub=0 burst=1.0 awaiting-publish
                roles=[T R R] engines=[0:0/4! 1:0/4 2:0/4 100:0/4] ready=[] batch=- supply=0/1 since=- wakeup=-
            at 20 decide
              begin cell0 -> rollout
              dispatch 2 groups g2..g3 (2 executions, v_d=1)
              open step1
              start 2: engine100[e2..e3]
              = d=4 p=4 f=2 w=2 C_R=12 k=1 v_t=1 v_pub=1 burst=1.0
                roles=[T>R R R] engines=[0:0/4! 1:0/4 2:0/4 100:2/4] ready=[] batch=step1{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 21 decide
              (nothing)
              = d=4 p=4 f=2 w=2 C_R=16 k=0 v_t=1 v_pub=1 burst=1.0
                roles=[R R R] engines=[0:0/4 1:0/4 2:0/4 100:2/4] ready=[] batch=step1{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
        "#]],
    );
}

/// eq (2): the next cell may enter training only if w ≤ C_R − C_e. With C_R = 4, C_e = 2 the
/// join waits while w = 3 (supply already holds) and happens at w = 2; its running executions
/// move to the free slots of cell1.
#[test]
fn eq2_water_level_blocks_then_allows_a_join() {
    check(
        "config mode=elastic phi=1 mu=1 n=1 b=2 rho_min=0.5 tau=0 cells=2x2
         at 0 decide
         at 10 finish e0
         at 10 decide
         at 20 finish e1
         at 20 decide",
        expect![[r#"
            at 0 decide
              dispatch 4 groups g0..g3 (4 executions, v_d=0)
              open step0
              start 4: engine1[e0..e1] engine0[e2..e3]
              = d=4 p=4 f=0 w=4 C_R=4 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:2/2 1:2/2] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              (nothing)
              = d=4 p=4 f=1 w=3 C_R=4 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:2/2 1:1/2] ready=[g0] batch=step0{none ms=0 claimed=0 done=0} supply=1/1 since=10 wakeup=-
            at 20 decide
              begin cell0 -> training
              routes from engine0: e2..e3->engine1
              = d=4 p=4 f=2 w=2 C_R=2 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R] engines=[0:0/2x 1:2/2] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=10 wakeup=-
        "#]],
    );
}

/// Supply check: ρ_min·B = 2 ready groups must hold continuously for τ = 10 s. It starts
/// holding at 105, `next_wakeup` reports 115, nothing happens at 110, the join happens at 115.
#[test]
fn supply_check_needs_rho_min_b_for_tau() {
    check(
        "config mode=elastic phi=0 mu=1 n=1 b=4 rho_min=0.5 tau=10 cells=2x4 standalone=4
         at 0 decide
         at 100 finish e0
         at 100 decide
         at 105 finish e1
         at 105 decide
         at 110 decide
         at 114 tick
         at 114 decide
         at 115 decide",
        expect![[r#"
            at 0 decide
              dispatch 4 groups g0..g3 (4 executions, v_d=0)
              open step0
              start 4: engine100[e0..e3]
              = d=4 p=4 f=0 w=4 C_R=12 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:0/4 1:0/4 100:4/4] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/2 since=- wakeup=-
            at 100 decide
              (nothing)
              = d=4 p=4 f=1 w=3 C_R=12 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:0/4 1:0/4 100:3/4] ready=[g0] batch=step0{none ms=0 claimed=0 done=0} supply=1/2 since=- wakeup=-
            at 105 decide
              (nothing)
              = d=4 p=4 f=2 w=2 C_R=12 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:0/4 1:0/4 100:2/4] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/2 since=105 wakeup=115
            at 110 decide
              (nothing)
              = d=4 p=4 f=2 w=2 C_R=12 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:0/4 1:0/4 100:2/4] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/2 since=105 wakeup=115
            at 114 decide
              (nothing)
              = d=4 p=4 f=2 w=2 C_R=12 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:0/4 1:0/4 100:2/4] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/2 since=105 wakeup=115
            at 115 decide
              begin cell0 -> training
              = d=4 p=4 f=2 w=2 C_R=8 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R] engines=[0:0/4x 1:0/4 100:2/4] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/2 since=105 wakeup=-
        "#]],
    );
}

/// The supply timer resets after each transition: cell0 completes at 120, so cell1 may join
/// only at 130 (not at 115 + 10 = 125, when the supply had held for τ without the reset).
#[test]
fn supply_timer_resets_after_a_transition() {
    check(
        "config mode=elastic phi=0 mu=1 n=1 b=4 rho_min=0.5 tau=10 cells=3x4 standalone=4
         at 0 decide
         at 105 finish e0-e3
         at 115 decide
         at 120 complete cell0 training
         at 120 decide
         at 125 decide
         at 130 decide",
        expect![[r#"
            at 0 decide
              dispatch 4 groups g0..g3 (4 executions, v_d=0)
              open step0
              start 4: engine100[e0..e3]
              = d=4 p=4 f=0 w=4 C_R=16 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R R] engines=[0:0/4 1:0/4 2:0/4 100:4/4] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/2 since=- wakeup=-
            at 115 decide
              begin cell0 -> training
              = d=4 p=4 f=4 w=0 C_R=12 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R R] engines=[0:0/4x 1:0/4 2:0/4 100:0/4] ready=[g0,g1,g2,g3] batch=step0{none ms=0 claimed=0 done=0} supply=4/2 since=105 wakeup=-
            at 120 decide
              (nothing)
              = d=4 p=4 f=4 w=0 C_R=12 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R R] engines=[0:0/4! 1:0/4 2:0/4 100:0/4] ready=[g0,g1,g2,g3] batch=step0{none ms=0 claimed=0 done=0} supply=4/2 since=120 wakeup=130
            at 125 decide
              (nothing)
              = d=4 p=4 f=4 w=0 C_R=12 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R R] engines=[0:0/4! 1:0/4 2:0/4 100:0/4] ready=[g0,g1,g2,g3] batch=step0{none ms=0 claimed=0 done=0} supply=4/2 since=120 wakeup=130
            at 130 decide
              begin cell1 -> training
              = d=4 p=4 f=4 w=0 C_R=8 k=2 v_t=0 v_pub=0 burst=0.0
                roles=[T R>T R] engines=[0:0/4! 1:0/4x 2:0/4 100:0/4] ready=[g0,g1,g2,g3] batch=step0{none ms=0 claimed=0 done=0} supply=4/2 since=120 wakeup=-
        "#]],
    );
}

/// The supply timer resets at each batch start. Without streaming the supply counts the whole
/// burst's data, so it holds continuously from 31 (cell0's transition) through the end of step 0;
/// the next batch opens at 40 and restarts the timer, so cell1 joins at 50, not at 41.
#[test]
fn supply_timer_resets_at_each_batch_start() {
    check(
        "config mode=elastic phi=1 mu=2 n=1 b=1 rho_min=1 tau=10 cells=3x2 standalone=2 streaming=off
         at 0 decide
         at 20 finish e0-e2
         at 20 decide
         at 30 decide
         at 31 complete cell0 training
         at 31 pack
         at 31 claim-all cell0
         at 32 done-all
         at 32 decide
         at 40 optimizer
         at 40 state
         at 40 decide
         at 45 decide
         at 50 decide",
        expect![[r#"
            at 0 decide
              dispatch 3 groups g0..g2 (3 executions, v_d=0)
              open step0
              start 3: engine100[e0..e1] engine2[e2]
              = d=3 p=3 f=0 w=3 C_R=8 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R R] engines=[0:0/2 1:0/2 2:1/2 100:2/2] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/2 since=- wakeup=-
            at 20 decide
              (nothing)
              = d=3 p=3 f=3 w=0 C_R=8 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R R] engines=[0:0/2 1:0/2 2:0/2 100:0/2] ready=[g0,g1,g2] batch=step0{none ms=0 claimed=0 done=0} supply=2/2 since=20 wakeup=30
            at 30 decide
              begin cell0 -> training
              = d=3 p=3 f=3 w=0 C_R=6 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R R] engines=[0:0/2x 1:0/2 2:0/2 100:0/2] ready=[g0,g1,g2] batch=step0{none ms=0 claimed=0 done=0} supply=2/2 since=20 wakeup=-
            at 32 decide
              join-window-closed step0
              = d=3 p=3 f=3 w=0 C_R=6 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R R] engines=[0:0/2! 1:0/2 2:0/2 100:0/2] ready=[g1,g2] batch=step0{g0 ms=1 claimed=1 done=1 stream-closed window-closed} supply=1/1 since=31 wakeup=-
            at 40 optimizer
              step0 -> v1 consumed g0:d=0
            at 40 state
              = d=3 p=3 f=3 w=0 C_R=6 k=1 v_t=1 v_pub=0 burst=0.1
                roles=[T R R] engines=[0:0/2! 1:0/2 2:0/2 100:0/2] ready=[g1,g2] batch=- supply=1/1 since=31 wakeup=-
            at 40 decide
              open step1
              = d=3 p=3 f=3 w=0 C_R=6 k=1 v_t=1 v_pub=0 burst=0.1
                roles=[T R R] engines=[0:0/2! 1:0/2 2:0/2 100:0/2] ready=[g1,g2] batch=step1{none ms=0 claimed=0 done=0} supply=1/1 since=40 wakeup=50
            at 45 decide
              (nothing)
              = d=3 p=3 f=3 w=0 C_R=6 k=1 v_t=1 v_pub=0 burst=0.1
                roles=[T R R] engines=[0:0/2! 1:0/2 2:0/2 100:0/2] ready=[g1,g2] batch=step1{none ms=0 claimed=0 done=0} supply=1/1 since=40 wakeup=50
            at 50 decide
              begin cell1 -> training
              = d=3 p=3 f=3 w=0 C_R=4 k=2 v_t=1 v_pub=0 burst=0.1
                roles=[T R>T R] engines=[0:0/2! 1:0/2x 2:0/2 100:0/2] ready=[g1,g2] batch=step1{none ms=0 claimed=0 done=0} supply=1/1 since=40 wakeup=-
        "#]],
    );
}

/// A supply dip resets the timer: supply holds from 10 (cell0's transition; 2 of ρ_min·B = 2),
/// cell0 claims both packed groups at 12 so it drops to 0, and when two more groups are ready at
/// 17 the timer restarts there: cell1 joins at 22 (τ = 5), not at 15.
#[test]
fn supply_dip_restarts_the_timer() {
    check(
        "config mode=elastic phi=0 mu=1 n=1 b=4 rho_min=0.5 tau=5 cells=3x4 standalone=4
         at 0 decide
         at 4 finish e0-e1
         at 9 decide
         at 10 complete cell0 training
         at 10 decide
         at 10 pack
         at 10 state
         at 12 claim-all cell0
         at 12 state
         at 15 decide
         at 17 finish e2-e3
         at 17 decide
         at 20 decide
         at 22 decide",
        expect![[r#"
            at 0 decide
              dispatch 4 groups g0..g3 (4 executions, v_d=0)
              open step0
              start 4: engine100[e0..e3]
              = d=4 p=4 f=0 w=4 C_R=16 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R R] engines=[0:0/4 1:0/4 2:0/4 100:4/4] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/2 since=- wakeup=-
            at 9 decide
              begin cell0 -> training
              = d=4 p=4 f=2 w=2 C_R=12 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R R] engines=[0:0/4x 1:0/4 2:0/4 100:2/4] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/2 since=4 wakeup=-
            at 10 decide
              (nothing)
              = d=4 p=4 f=2 w=2 C_R=12 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R R] engines=[0:0/4! 1:0/4 2:0/4 100:2/4] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/2 since=10 wakeup=15
            at 10 state
              = d=4 p=4 f=2 w=2 C_R=12 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R R] engines=[0:0/4! 1:0/4 2:0/4 100:2/4] ready=[] batch=step0{g0,g1 ms=2 claimed=0 done=0} supply=2/2 since=10 wakeup=15
            at 12 state
              = d=4 p=4 f=2 w=2 C_R=12 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R R] engines=[0:0/4! 1:0/4 2:0/4 100:2/4] ready=[] batch=step0{g0,g1 ms=2 claimed=2 done=0} supply=0/2 since=- wakeup=-
            at 15 decide
              (nothing)
              = d=4 p=4 f=2 w=2 C_R=12 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R R] engines=[0:0/4! 1:0/4 2:0/4 100:2/4] ready=[] batch=step0{g0,g1 ms=2 claimed=2 done=0} supply=0/2 since=- wakeup=-
            at 17 decide
              (nothing)
              = d=4 p=4 f=4 w=0 C_R=12 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R R] engines=[0:0/4! 1:0/4 2:0/4 100:0/4] ready=[g2,g3] batch=step0{g0,g1 ms=2 claimed=2 done=0} supply=2/2 since=17 wakeup=22
            at 20 decide
              (nothing)
              = d=4 p=4 f=4 w=0 C_R=12 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R R] engines=[0:0/4! 1:0/4 2:0/4 100:0/4] ready=[g2,g3] batch=step0{g0,g1 ms=2 claimed=2 done=0} supply=2/2 since=17 wakeup=22
            at 22 decide
              begin cell1 -> training
              = d=4 p=4 f=4 w=0 C_R=8 k=2 v_t=0 v_pub=0 burst=0.0
                roles=[T R>T R] engines=[0:0/4! 1:0/4x 2:0/4 100:0/4] ready=[g2,g3] batch=step0{g0,g1 ms=2 claimed=2 done=0} supply=2/2 since=17 wakeup=-
        "#]],
    );
}

/// Transitions are serial and form a growing prefix: the core first, then cell1, then cell2; no
/// second join while one is in progress, even when eq (2) and the supply check hold (τ = 0).
#[test]
fn transitions_are_serial_core_first_then_satellites_in_index_order() {
    check(
        "config mode=elastic phi=0 mu=1 n=1 b=2 rho_min=0.5 tau=0 cells=3x2 standalone=2
         at 0 decide
         at 10 finish e0-e1
         at 10 decide
         at 11 decide
         at 12 complete cell0 training
         at 12 decide
         at 13 decide
         at 14 complete cell1 training
         at 14 decide",
        expect![[r#"
            at 0 decide
              dispatch 2 groups g0..g1 (2 executions, v_d=0)
              open step0
              start 2: engine100[e0..e1]
              = d=2 p=2 f=0 w=2 C_R=8 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R R] engines=[0:0/2 1:0/2 2:0/2 100:2/2] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              begin cell0 -> training
              = d=2 p=2 f=2 w=0 C_R=6 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R R] engines=[0:0/2x 1:0/2 2:0/2 100:0/2] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=10 wakeup=-
            at 11 decide
              (nothing)
              = d=2 p=2 f=2 w=0 C_R=6 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R R] engines=[0:0/2x 1:0/2 2:0/2 100:0/2] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=10 wakeup=-
            at 12 decide
              begin cell1 -> training
              = d=2 p=2 f=2 w=0 C_R=4 k=2 v_t=0 v_pub=0 burst=0.0
                roles=[T R>T R] engines=[0:0/2! 1:0/2x 2:0/2 100:0/2] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=12 wakeup=-
            at 13 decide
              (nothing)
              = d=2 p=2 f=2 w=0 C_R=4 k=2 v_t=0 v_pub=0 burst=0.0
                roles=[T R>T R] engines=[0:0/2! 1:0/2x 2:0/2 100:0/2] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=12 wakeup=-
            at 14 decide
              begin cell2 -> training
              = d=2 p=2 f=2 w=0 C_R=2 k=3 v_t=0 v_pub=0 burst=0.0
                roles=[T T R>T] engines=[0:0/2! 1:0/2! 2:0/2x 100:0/2] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=14 wakeup=-
        "#]],
    );
}

/// Burst end, core stays: satellites return at once; after the publish the next batch already
/// has ρ_min·B = 1 ready group (g2, g3) and eq (3) w + μ·N·B = 0 + 2 ≤ C_s + (K−1)·C_e = 6
/// holds, so the core stays in training and only the dispatch follows.
#[test]
fn burst_end_core_stays_when_eq3_and_supply_hold() {
    check(
        "config mode=elastic phi=1 mu=1 n=1 b=2 rho_min=0.5 tau=5 cells=3x2 standalone=2
         at 0 decide
         at 10 finish e0-e3
         at 10 decide
         at 15 decide
         at 20 complete cell0 training
         at 25 decide
         at 30 complete cell1 training
         at 30 pack
         at 30 claim cell0
         at 30 claim cell1
         at 31 done-all
         at 31 decide
         at 32 optimizer
         at 32 decide
         at 40 publish
         at 40 decide
         at 41 complete cell1 rollout
         at 41 decide",
        expect![[r#"
            at 0 decide
              dispatch 4 groups g0..g3 (4 executions, v_d=0)
              open step0
              start 4: engine100[e0..e1] engine2[e2..e3]
              = d=4 p=4 f=0 w=4 C_R=8 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R R] engines=[0:0/2 1:0/2 2:2/2 100:2/2] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              (nothing)
              = d=4 p=4 f=4 w=0 C_R=8 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R R] engines=[0:0/2 1:0/2 2:0/2 100:0/2] ready=[g0,g1,g2,g3] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=10 wakeup=15
            at 15 decide
              begin cell0 -> training
              = d=4 p=4 f=4 w=0 C_R=6 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R R] engines=[0:0/2x 1:0/2 2:0/2 100:0/2] ready=[g0,g1,g2,g3] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=10 wakeup=-
            at 25 decide
              begin cell1 -> training
              = d=4 p=4 f=4 w=0 C_R=4 k=2 v_t=0 v_pub=0 burst=0.0
                roles=[T R>T R] engines=[0:0/2! 1:0/2x 2:0/2 100:0/2] ready=[g0,g1,g2,g3] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=20 wakeup=-
            at 31 decide
              join-window-closed step0
              = d=4 p=4 f=4 w=0 C_R=4 k=2 v_t=0 v_pub=0 burst=0.0
                roles=[T T R] engines=[0:0/2! 1:0/2! 2:0/2 100:0/2] ready=[g2,g3] batch=step0{g0,g1 ms=2 claimed=2 done=2 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 32 optimizer
              step0 -> v1 consumed g0:d=0 g1:d=0
            at 32 decide
              burst-ended 0
              begin cell1 -> rollout
              = d=4 p=4 f=4 w=0 C_R=4 k=2 v_t=1 v_pub=0 burst=1.0 awaiting-publish
                roles=[T T>R R] engines=[0:0/2! 1:0/2! 2:0/2 100:0/2] ready=[g2,g3] batch=- supply=2/1 since=32 wakeup=-
            at 40 decide
              dispatch 2 groups g4..g5 (2 executions, v_d=1)
              open step1
              start 2: engine100[e4..e5]
              = d=6 p=6 f=4 w=2 C_R=4 k=2 v_t=1 v_pub=1 burst=1.0
                roles=[T T>R R] engines=[0:0/2! 1:0/2! 2:0/2 100:2/2] ready=[g2,g3] batch=step1{none ms=0 claimed=0 done=0} supply=2/1 since=40 wakeup=-
            at 41 decide
              (nothing)
              = d=6 p=6 f=4 w=2 C_R=6 k=1 v_t=1 v_pub=1 burst=1.0
                roles=[T R R] engines=[0:0/2! 1:0/2 2:0/2 100:2/2] ready=[g2,g3] batch=step1{none ms=0 claimed=0 done=0} supply=2/1 since=41 wakeup=46
        "#]],
    );
}

/// Burst end, core returns because eq (3) fails: w = 1 (e3 still running) + μ·N·B = 2 exceeds
/// C_s + (K−1)·C_e = 1, although ρ_min·B = 1 ready group (g2) is there.
#[test]
fn burst_end_core_returns_when_eq3_fails() {
    check(
        "config mode=elastic phi=1 mu=1 n=1 b=2 rho_min=0.5 tau=0 cells=2x1
         at 0 decide
         at 10 finish e0-e1
         at 10 decide
         at 20 finish e2
         at 20 decide
         at 21 complete cell0 training
         at 21 pack
         at 21 claim-all cell0
         at 22 done-all
         at 22 decide
         at 23 optimizer
         at 23 decide
         at 30 publish
         at 30 decide",
        expect![[r#"
            at 0 decide
              dispatch 4 groups g0..g3 (4 executions, v_d=0)
              open step0
              start 2: engine1[e0] engine0[e1]
              = d=4 p=2 f=0 w=4 C_R=2 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:1/1 1:1/1] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              start 2: engine1[e2] engine0[e3]
              = d=4 p=4 f=2 w=2 C_R=2 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:1/1 1:1/1] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=10 wakeup=-
            at 20 decide
              begin cell0 -> training
              routes from engine0: e3->engine1
              = d=4 p=4 f=3 w=1 C_R=1 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R] engines=[0:0/1x 1:1/1] ready=[g0,g1,g2] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=10 wakeup=-
            at 22 decide
              join-window-closed step0
              = d=4 p=4 f=3 w=1 C_R=1 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R] engines=[0:0/1! 1:1/1] ready=[g2] batch=step0{g0,g1 ms=2 claimed=2 done=2 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 23 optimizer
              step0 -> v1 consumed g0:d=0 g1:d=0
            at 23 decide
              burst-ended 0
              = d=4 p=4 f=3 w=1 C_R=1 k=1 v_t=1 v_pub=0 burst=1.0 awaiting-publish
                roles=[T R] engines=[0:0/1! 1:1/1] ready=[g2] batch=- supply=1/1 since=23 wakeup=-
            at 30 decide
              begin cell0 -> rollout
              dispatch 2 groups g4..g5 (2 executions, v_d=1)
              open step1
              = d=6 p=4 f=3 w=3 C_R=1 k=1 v_t=1 v_pub=1 burst=1.0
                roles=[T>R R] engines=[0:0/1! 1:1/1] ready=[g2] batch=step1{none ms=0 claimed=0 done=0} supply=1/1 since=30 wakeup=-
        "#]],
    );
}

/// Burst end, core returns because the next batch has no ready group (0 < ρ_min·B = 1), although
/// eq (3) holds: w + μ·N·B = 0 + 2 ≤ C_s + (K−1)·C_e = 2.
#[test]
fn burst_end_core_returns_when_supply_is_short() {
    check(
        "config mode=elastic phi=0 mu=1 n=1 b=2 rho_min=0.5 tau=0 cells=2x2
         at 0 decide
         at 10 finish e0-e1
         at 10 decide
         at 11 complete cell0 training
         at 11 pack
         at 11 claim-all cell0
         at 12 done-all
         at 12 decide
         at 13 optimizer
         at 13 decide
         at 20 publish
         at 20 decide
         at 21 complete cell0 rollout
         at 21 decide",
        expect![[r#"
            at 0 decide
              dispatch 2 groups g0..g1 (2 executions, v_d=0)
              open step0
              start 2: engine1[e0..e1]
              = d=2 p=2 f=0 w=2 C_R=4 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R] engines=[0:0/2 1:2/2] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              begin cell0 -> training
              = d=2 p=2 f=2 w=0 C_R=2 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R] engines=[0:0/2x 1:0/2] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=10 wakeup=-
            at 12 decide
              join-window-closed step0
              = d=2 p=2 f=2 w=0 C_R=2 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R] engines=[0:0/2! 1:0/2] ready=[] batch=step0{g0,g1 ms=2 claimed=2 done=2 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 13 optimizer
              step0 -> v1 consumed g0:d=0 g1:d=0
            at 13 decide
              burst-ended 0
              = d=2 p=2 f=2 w=0 C_R=2 k=1 v_t=1 v_pub=0 burst=1.0 awaiting-publish
                roles=[T R] engines=[0:0/2! 1:0/2] ready=[] batch=- supply=0/1 since=- wakeup=-
            at 20 decide
              begin cell0 -> rollout
              dispatch 2 groups g2..g3 (2 executions, v_d=1)
              open step1
              start 2: engine1[e2..e3]
              = d=4 p=4 f=2 w=2 C_R=2 k=1 v_t=1 v_pub=1 burst=1.0
                roles=[T>R R] engines=[0:0/2! 1:2/2] ready=[] batch=step1{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 21 decide
              (nothing)
              = d=4 p=4 f=2 w=2 C_R=4 k=0 v_t=1 v_pub=1 burst=1.0
                roles=[R R] engines=[0:0/2 1:2/2] ready=[] batch=step1{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
        "#]],
    );
}

/// Destination order of route moves: the standalone pool first, then rollout cells in descending
/// index, skipping full engines. cell0's e8 goes to engine100, e9 to engine2 (engine3 is full,
/// engine2 comes before engine1). An engine that goes down hands its executions over the same way.
#[test]
fn route_moves_go_standalone_first_then_cells_in_descending_index() {
    check(
        "config mode=elastic phi=1 mu=1 n=1 b=5 rho_min=0.5 tau=0 cells=4x2 standalone=2
         at 0 decide
         at 10 finish e0,e4,e6
         at 10 decide
         at 20 finish e1
         at 20 engine-down engine3
         at 20 decide
         at 30 engine-ready engine3
         at 30 decide",
        expect![[r#"
            at 0 decide
              dispatch 10 groups g0..g9 (10 executions, v_d=0)
              open step0
              start 10: engine100[e0..e1] engine3[e2..e3] engine2[e4..e5] engine1[e6..e7] engine0[e8..e9]
              = d=10 p=10 f=0 w=10 C_R=10 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R R R] engines=[0:2/2 1:2/2 2:2/2 3:2/2 100:2/2] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/3 since=- wakeup=-
            at 10 decide
              begin cell0 -> training
              routes from engine0: e8->engine100 e9->engine2
              = d=10 p=10 f=3 w=7 C_R=8 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R R R] engines=[0:0/2x 1:1/2 2:2/2 3:2/2 100:2/2] ready=[g0,g4,g6] batch=step0{none ms=0 claimed=0 done=0} supply=3/3 since=10 wakeup=-
            at 20 decide
              routes from engine3: e2->engine100 e3->engine1
              = d=10 p=10 f=4 w=6 C_R=6 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R R R] engines=[0:0/2x 1:2/2 2:2/2 3:0/2! 100:2/2] ready=[g0,g1,g4,g6] batch=step0{none ms=0 claimed=0 done=0} supply=4/3 since=10 wakeup=-
            at 30 decide
              (nothing)
              = d=10 p=10 f=4 w=6 C_R=8 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R R R] engines=[0:0/2x 1:2/2 2:2/2 3:0/2 100:2/2] ready=[g0,g1,g4,g6] batch=step0{none ms=0 claimed=0 done=0} supply=4/3 since=10 wakeup=-
        "#]],
    );
}

/// Staleness d = v_t − v_d is recorded per consumed group. With φ = 1, μ = 2, B = 1 the
/// steady-state values alternate 2, 1 (mean 1.5 = φ + (μ−1)/2, Theorem A.1); the packer takes
/// the oldest policy version first.
#[test]
fn staleness_is_recorded_on_optimizer_steps() {
    check(
        "config mode=elastic phi=1 mu=2 n=1 b=1 rho_min=1 tau=0 cells=1x2 standalone=4
         at 0 decide
         at 10 finish e0-e2
         at 10 decide
         at 11 complete cell0 training
         at 11 pack
         at 11 claim-all cell0
         at 11 done-all
         at 11 decide
         at 12 optimizer
         at 12 decide
         at 12 pack
         at 12 claim-all cell0
         at 12 done-all
         at 12 decide
         at 13 optimizer
         at 13 decide
         at 14 publish
         at 14 decide
         at 20 finish e3-e4
         at 20 pack
         at 20 claim-all cell0
         at 20 done-all
         at 20 decide
         at 21 optimizer
         at 21 decide
         at 21 pack
         at 21 claim-all cell0
         at 21 done-all
         at 21 decide
         at 22 optimizer
         at 22 decide
         at 23 publish
         at 23 decide
         at 30 finish e5-e6
         at 30 pack
         at 30 claim-all cell0
         at 30 done-all
         at 30 decide
         at 31 optimizer",
        expect![[r#"
            at 0 decide
              dispatch 3 groups g0..g2 (3 executions, v_d=0)
              open step0
              start 3: engine100[e0..e2]
              = d=3 p=3 f=0 w=3 C_R=6 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R] engines=[0:0/2 100:3/4] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              begin cell0 -> training
              = d=3 p=3 f=3 w=0 C_R=4 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T] engines=[0:0/2x 100:0/4] ready=[g0,g1,g2] batch=step0{none ms=0 claimed=0 done=0} supply=1/1 since=10 wakeup=-
            at 11 decide
              join-window-closed step0
              = d=3 p=3 f=3 w=0 C_R=4 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T] engines=[0:0/2! 100:0/4] ready=[g1,g2] batch=step0{g0 ms=1 claimed=1 done=1 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 12 optimizer
              step0 -> v1 consumed g0:d=0
            at 12 decide
              open step1
              = d=3 p=3 f=3 w=0 C_R=4 k=1 v_t=1 v_pub=0 burst=0.1
                roles=[T] engines=[0:0/2! 100:0/4] ready=[g1,g2] batch=step1{none ms=0 claimed=0 done=0} supply=1/1 since=12 wakeup=-
            at 12 decide
              join-window-closed step1
              = d=3 p=3 f=3 w=0 C_R=4 k=1 v_t=1 v_pub=0 burst=0.1
                roles=[T] engines=[0:0/2! 100:0/4] ready=[g2] batch=step1{g1 ms=1 claimed=1 done=1 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 13 optimizer
              step1 -> v2 consumed g1:d=1
            at 13 decide
              burst-ended 0
              = d=3 p=3 f=3 w=0 C_R=4 k=1 v_t=2 v_pub=0 burst=1.0 awaiting-publish
                roles=[T] engines=[0:0/2! 100:0/4] ready=[g2] batch=- supply=1/1 since=13 wakeup=-
            at 14 decide
              dispatch 2 groups g3..g4 (2 executions, v_d=2)
              open step2
              start 2: engine100[e3..e4]
              = d=5 p=5 f=3 w=2 C_R=4 k=1 v_t=2 v_pub=2 burst=1.0
                roles=[T] engines=[0:0/2! 100:2/4] ready=[g2] batch=step2{none ms=0 claimed=0 done=0} supply=1/1 since=14 wakeup=-
            at 20 decide
              join-window-closed step2
              = d=5 p=5 f=5 w=0 C_R=4 k=1 v_t=2 v_pub=2 burst=1.0
                roles=[T] engines=[0:0/2! 100:0/4] ready=[g3,g4] batch=step2{g2 ms=1 claimed=1 done=1 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 21 optimizer
              step2 -> v3 consumed g2:d=2
            at 21 decide
              open step3
              = d=5 p=5 f=5 w=0 C_R=4 k=1 v_t=3 v_pub=2 burst=1.1
                roles=[T] engines=[0:0/2! 100:0/4] ready=[g3,g4] batch=step3{none ms=0 claimed=0 done=0} supply=1/1 since=21 wakeup=-
            at 21 decide
              join-window-closed step3
              = d=5 p=5 f=5 w=0 C_R=4 k=1 v_t=3 v_pub=2 burst=1.1
                roles=[T] engines=[0:0/2! 100:0/4] ready=[g4] batch=step3{g3 ms=1 claimed=1 done=1 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 22 optimizer
              step3 -> v4 consumed g3:d=1
            at 22 decide
              burst-ended 1
              = d=5 p=5 f=5 w=0 C_R=4 k=1 v_t=4 v_pub=2 burst=2.0 awaiting-publish
                roles=[T] engines=[0:0/2! 100:0/4] ready=[g4] batch=- supply=1/1 since=22 wakeup=-
            at 23 decide
              dispatch 2 groups g5..g6 (2 executions, v_d=4)
              open step4
              start 2: engine100[e5..e6]
              = d=7 p=7 f=5 w=2 C_R=4 k=1 v_t=4 v_pub=4 burst=2.0
                roles=[T] engines=[0:0/2! 100:2/4] ready=[g4] batch=step4{none ms=0 claimed=0 done=0} supply=1/1 since=23 wakeup=-
            at 30 decide
              join-window-closed step4
              = d=7 p=7 f=7 w=0 C_R=4 k=1 v_t=4 v_pub=4 burst=2.0
                roles=[T] engines=[0:0/2! 100:0/4] ready=[g5,g6] batch=step4{g4 ms=1 claimed=1 done=1 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 31 optimizer
              step4 -> v5 consumed g4:d=2
        "#]],
    );
}

/// Colocate is a configuration: one cell holding every node, φ = 0, no streaming. It enters
/// training only at w = 0 (C_R − C_e = 0), and returns after every burst since eq (3) cannot
/// hold without standalone capacity.
#[test]
fn colocate_single_cell_switches_only_at_zero_water_level() {
    check(
        "config mode=colocate phi=0 mu=1 n=1 b=2 rho_min=0.5 tau=0 cells=1x4 streaming=off
         at 0 decide
         at 10 finish e0
         at 10 decide
         at 20 finish e1
         at 20 decide
         at 21 complete cell0 training
         at 21 pack
         at 21 claim-all cell0
         at 22 done-all
         at 22 decide
         at 23 optimizer
         at 23 decide
         at 30 publish
         at 30 decide
         at 31 complete cell0 rollout
         at 31 decide",
        expect![[r#"
            at 0 decide
              dispatch 2 groups g0..g1 (2 executions, v_d=0)
              open step0
              start 2: engine0[e0..e1]
              = d=2 p=2 f=0 w=2 C_R=4 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R] engines=[0:2/4] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/2 since=- wakeup=-
            at 10 decide
              (nothing)
              = d=2 p=2 f=1 w=1 C_R=4 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R] engines=[0:1/4] ready=[g0] batch=step0{none ms=0 claimed=0 done=0} supply=1/2 since=- wakeup=-
            at 20 decide
              begin cell0 -> training
              = d=2 p=2 f=2 w=0 C_R=0 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T] engines=[0:0/4x] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/2 since=20 wakeup=-
            at 22 decide
              join-window-closed step0
              = d=2 p=2 f=2 w=0 C_R=0 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T] engines=[0:0/4!] ready=[] batch=step0{g0,g1 ms=2 claimed=2 done=2 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 23 optimizer
              step0 -> v1 consumed g0:d=0 g1:d=0
            at 23 decide
              burst-ended 0
              = d=2 p=2 f=2 w=0 C_R=0 k=1 v_t=1 v_pub=0 burst=1.0 awaiting-publish
                roles=[T] engines=[0:0/4!] ready=[] batch=- supply=0/2 since=- wakeup=-
            at 30 decide
              begin cell0 -> rollout
              dispatch 2 groups g2..g3 (2 executions, v_d=1)
              open step1
              = d=4 p=2 f=2 w=2 C_R=0 k=1 v_t=1 v_pub=1 burst=1.0
                roles=[T>R] engines=[0:0/4!] ready=[] batch=step1{none ms=0 claimed=0 done=0} supply=0/2 since=- wakeup=-
            at 31 decide
              start 2: engine0[e2..e3]
              = d=4 p=4 f=2 w=2 C_R=4 k=0 v_t=1 v_pub=1 burst=1.0
                roles=[R] engines=[0:2/4] ready=[] batch=step1{none ms=0 claimed=0 done=0} supply=0/2 since=- wakeup=-
        "#]],
    );
    // With streaming the supply check holds after one ready group, yet eq (2) still waits for w = 0.
    check(
        "config mode=colocate phi=0 mu=1 n=1 b=2 rho_min=0.5 tau=0 cells=1x4
         at 0 decide
         at 10 finish e0
         at 10 decide
         at 20 finish e1
         at 20 decide",
        expect![[r#"
            at 0 decide
              dispatch 2 groups g0..g1 (2 executions, v_d=0)
              open step0
              start 2: engine0[e0..e1]
              = d=2 p=2 f=0 w=2 C_R=4 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R] engines=[0:2/4] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              (nothing)
              = d=2 p=2 f=1 w=1 C_R=4 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R] engines=[0:1/4] ready=[g0] batch=step0{none ms=0 claimed=0 done=0} supply=1/1 since=10 wakeup=-
            at 20 decide
              begin cell0 -> training
              = d=2 p=2 f=2 w=0 C_R=0 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T] engines=[0:0/4x] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=10 wakeup=-
        "#]],
    );
}

/// Async is a configuration: a static partition (cell0 trains, cells 1–2 roll out) that never
/// transitions, not at burst end, not after the publish, however long it waits.
#[test]
fn async_static_partition_never_transitions() {
    check(
        "config mode=async phi=1 mu=1 n=1 b=1 rho_min=0.5 tau=0 cells=3x2 async_cells=1
         at 0 decide
         at 10 finish e0
         at 10 decide
         at 10 pack
         at 10 claim-all cell0
         at 11 done-all
         at 11 decide
         at 12 optimizer
         at 12 decide
         at 20 publish
         at 20 decide
         at 1000 finish e1-e2
         at 1000 decide",
        expect![[r#"
            at 0 decide
              dispatch 2 groups g0..g1 (2 executions, v_d=0)
              open step0
              start 2: engine2[e0..e1]
              = d=2 p=2 f=0 w=2 C_R=4 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R R] engines=[0:0/2! 1:0/2 2:2/2] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              (nothing)
              = d=2 p=2 f=1 w=1 C_R=4 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R R] engines=[0:0/2! 1:0/2 2:1/2] ready=[g0] batch=step0{none ms=0 claimed=0 done=0} supply=1/1 since=10 wakeup=-
            at 11 decide
              join-window-closed step0
              = d=2 p=2 f=1 w=1 C_R=4 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[T R R] engines=[0:0/2! 1:0/2 2:1/2] ready=[] batch=step0{g0 ms=1 claimed=1 done=1 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 12 optimizer
              step0 -> v1 consumed g0:d=0
            at 12 decide
              burst-ended 0
              = d=2 p=2 f=1 w=1 C_R=4 k=1 v_t=1 v_pub=0 burst=1.0 awaiting-publish
                roles=[T R R] engines=[0:0/2! 1:0/2 2:1/2] ready=[] batch=- supply=0/1 since=- wakeup=-
            at 20 decide
              dispatch 1 groups g2..g2 (1 executions, v_d=1)
              open step1
              start 1: engine2[e2]
              = d=3 p=3 f=1 w=2 C_R=4 k=1 v_t=1 v_pub=1 burst=1.0
                roles=[T R R] engines=[0:0/2! 1:0/2 2:2/2] ready=[] batch=step1{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 1000 decide
              (nothing)
              = d=3 p=3 f=3 w=0 C_R=4 k=1 v_t=1 v_pub=1 burst=1.0
                roles=[T R R] engines=[0:0/2! 1:0/2 2:0/2] ready=[g1,g2] batch=step1{none ms=0 claimed=0 done=0} supply=1/1 since=1000 wakeup=-
        "#]],
    );
}

/// Burst end returns every satellite at once, and their cell workers may report back in any
/// order: cell1 before cell2 here. The core stays in training meanwhile.
#[test]
fn burst_end_satellites_return_in_any_order() {
    check(
        "config mode=elastic phi=0 mu=1 n=1 b=3 rho_min=0.3 tau=0 cells=3x2 standalone=3
         at 0 decide
         at 10 finish e0-e2
         at 10 decide
         at 11 complete cell0 training
         at 11 pack 1
         at 11 claim cell0
         at 11 decide
         at 12 complete cell1 training
         at 12 pack 1
         at 12 claim cell1
         at 12 decide
         at 13 complete cell2 training
         at 13 pack
         at 13 claim cell2
         at 14 done-all
         at 14 decide
         at 15 optimizer
         at 15 decide
         at 16 complete cell1 rollout
         at 16 state
         at 17 complete cell2 rollout
         at 17 state",
        expect![[r#"
            at 0 decide
              dispatch 3 groups g0..g2 (3 executions, v_d=0)
              open step0
              start 3: engine100[e0..e2]
              = d=3 p=3 f=0 w=3 C_R=9 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R R] engines=[0:0/2 1:0/2 2:0/2 100:3/3] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              begin cell0 -> training
              = d=3 p=3 f=3 w=0 C_R=7 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R R] engines=[0:0/2x 1:0/2 2:0/2 100:0/3] ready=[g0,g1,g2] batch=step0{none ms=0 claimed=0 done=0} supply=3/1 since=10 wakeup=-
            at 11 decide
              begin cell1 -> training
              = d=3 p=3 f=3 w=0 C_R=5 k=2 v_t=0 v_pub=0 burst=0.0
                roles=[T R>T R] engines=[0:0/2! 1:0/2x 2:0/2 100:0/3] ready=[g1,g2] batch=step0{g0 ms=1 claimed=1 done=0} supply=2/1 since=11 wakeup=-
            at 12 decide
              begin cell2 -> training
              = d=3 p=3 f=3 w=0 C_R=3 k=3 v_t=0 v_pub=0 burst=0.0
                roles=[T T R>T] engines=[0:0/2! 1:0/2! 2:0/2x 100:0/3] ready=[g2] batch=step0{g0,g1 ms=2 claimed=2 done=0} supply=1/1 since=12 wakeup=-
            at 14 decide
              join-window-closed step0
              = d=3 p=3 f=3 w=0 C_R=3 k=3 v_t=0 v_pub=0 burst=0.0
                roles=[T T T] engines=[0:0/2! 1:0/2! 2:0/2! 100:0/3] ready=[] batch=step0{g0,g1,g2 ms=3 claimed=3 done=3 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 15 optimizer
              step0 -> v1 consumed g0:d=0 g1:d=0 g2:d=0
            at 15 decide
              burst-ended 0
              begin cell2 -> rollout
              begin cell1 -> rollout
              = d=3 p=3 f=3 w=0 C_R=3 k=3 v_t=1 v_pub=0 burst=1.0 awaiting-publish
                roles=[T T>R T>R] engines=[0:0/2! 1:0/2! 2:0/2! 100:0/3] ready=[] batch=- supply=0/1 since=- wakeup=-
            at 16 state
              = d=3 p=3 f=3 w=0 C_R=5 k=2 v_t=1 v_pub=0 burst=1.0 awaiting-publish
                roles=[T R T>R] engines=[0:0/2! 1:0/2 2:0/2! 100:0/3] ready=[] batch=- supply=0/1 since=- wakeup=-
            at 17 state
              = d=3 p=3 f=3 w=0 C_R=7 k=1 v_t=1 v_pub=0 burst=1.0 awaiting-publish
                roles=[T R R] engines=[0:0/2! 1:0/2 2:0/2 100:0/3] ready=[] batch=- supply=0/1 since=- wakeup=-
        "#]],
    );
}

/// A satellite still switching into training when the last micro-step is claimed: the join
/// window must not close under it, or the burst ends without it and it completes its join after
/// the burst, leaving a training cell behind a rollout one.
#[test]
fn join_under_way_keeps_the_join_window_open() {
    check(
        "config mode=elastic phi=0 mu=1 n=1 b=2 rho_min=0.5 tau=0 cells=3x2 standalone=2
         at 0 decide
         at 10 finish e0-e1
         at 10 decide
         at 11 complete cell0 training
         at 11 decide
         at 12 complete cell1 training
         at 12 decide
         at 12 pack
         at 12 claim cell0
         at 12 claim cell1
         at 13 done-all
         at 13 decide
         at 14 optimizer
         at 14 decide
         at 15 complete cell2 training
         at 15 decide
         at 15 claim cell2
         at 16 optimizer
         at 16 decide
         at 17 complete cell1 rollout
         at 17 complete cell2 rollout
         at 17 state",
        expect![[r#"
            at 0 decide
              dispatch 2 groups g0..g1 (2 executions, v_d=0)
              open step0
              start 2: engine100[e0..e1]
              = d=2 p=2 f=0 w=2 C_R=8 k=0 v_t=0 v_pub=0 burst=0.0
                roles=[R R R] engines=[0:0/2 1:0/2 2:0/2 100:2/2] ready=[] batch=step0{none ms=0 claimed=0 done=0} supply=0/1 since=- wakeup=-
            at 10 decide
              begin cell0 -> training
              = d=2 p=2 f=2 w=0 C_R=6 k=1 v_t=0 v_pub=0 burst=0.0
                roles=[R>T R R] engines=[0:0/2x 1:0/2 2:0/2 100:0/2] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=10 wakeup=-
            at 11 decide
              begin cell1 -> training
              = d=2 p=2 f=2 w=0 C_R=4 k=2 v_t=0 v_pub=0 burst=0.0
                roles=[T R>T R] engines=[0:0/2! 1:0/2x 2:0/2 100:0/2] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=11 wakeup=-
            at 12 decide
              begin cell2 -> training
              = d=2 p=2 f=2 w=0 C_R=2 k=3 v_t=0 v_pub=0 burst=0.0
                roles=[T T R>T] engines=[0:0/2! 1:0/2! 2:0/2x 100:0/2] ready=[g0,g1] batch=step0{none ms=0 claimed=0 done=0} supply=2/1 since=12 wakeup=-
            at 13 decide
              (nothing)
              = d=2 p=2 f=2 w=0 C_R=2 k=3 v_t=0 v_pub=0 burst=0.0
                roles=[T T R>T] engines=[0:0/2! 1:0/2! 2:0/2x 100:0/2] ready=[] batch=step0{g0,g1 ms=2 claimed=2 done=2 stream-closed} supply=0/1 since=- wakeup=-
            at 14 optimizer
              rejected: optimizer step for step0 before all micro-steps were done (state unchanged)
            at 14 decide
              (nothing)
              = d=2 p=2 f=2 w=0 C_R=2 k=3 v_t=0 v_pub=0 burst=0.0
                roles=[T T R>T] engines=[0:0/2! 1:0/2! 2:0/2x 100:0/2] ready=[] batch=step0{g0,g1 ms=2 claimed=2 done=2 stream-closed} supply=0/1 since=- wakeup=-
            at 15 decide
              join-window-closed step0
              = d=2 p=2 f=2 w=0 C_R=2 k=3 v_t=0 v_pub=0 burst=0.0
                roles=[T T T] engines=[0:0/2! 1:0/2! 2:0/2! 100:0/2] ready=[] batch=step0{g0,g1 ms=2 claimed=2 done=2 stream-closed window-closed} supply=0/1 since=- wakeup=-
            at 15 claim cell2
              nothing to claim
            at 16 optimizer
              step0 -> v1 consumed g0:d=0 g1:d=0
            at 16 decide
              burst-ended 0
              begin cell2 -> rollout
              begin cell1 -> rollout
              = d=2 p=2 f=2 w=0 C_R=2 k=3 v_t=1 v_pub=0 burst=1.0 awaiting-publish
                roles=[T T>R T>R] engines=[0:0/2! 1:0/2! 2:0/2! 100:0/2] ready=[] batch=- supply=0/1 since=- wakeup=-
            at 17 state
              = d=2 p=2 f=2 w=0 C_R=6 k=1 v_t=1 v_pub=0 burst=1.0 awaiting-publish
                roles=[T R R] engines=[0:0/2! 1:0/2 2:0/2 100:0/2] ready=[] batch=- supply=0/1 since=- wakeup=-
        "#]],
    );
}
