//! Process tests of the `gyre` binary (one integration-test binary per crate).

mod trajectory;
