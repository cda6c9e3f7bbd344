//! The model's conformance with the real thing, in one place: the evaluator's verdicts
//! against real connections through the kernel (`evaluator`), and the renderings loaded by the
//! real tools, `nft -f` and `iptables-restore` (`renderings`). Kernel tests: each in fresh
//! network namespaces, as root.

mod evaluator;
mod renderings;
