//! gyre-proxy's one integration-test binary (STYLE.md rule 15).

mod support;
mod template_cases;
