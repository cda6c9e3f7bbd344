//! The kernel features' table in docs/deploy/README.md against `redirect_kernel::nft::feature`
//! (no kernel: the kernel matrix runs nft_features in guests that have no docs).

use redirect_kernel::nft::feature;

/// docs/deploy/README.md lists every feature with its module and first release, as the code
/// has them (the error message and the docs say the same).
#[test]
fn the_deploy_docs_list_every_feature() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/deploy/README.md");
    let docs = std::fs::read_to_string(path).unwrap();
    for f in feature::FEATURES {
        let row = format!("| {} | `{}` | {} |", f.name, f.module, f.since.unwrap());
        assert!(docs.contains(&row), "{path} lacks the row {row}");
    }
    let rows = docs
        .lines()
        .filter(|l| l.starts_with("| nftables' "))
        .count();
    assert_eq!(
        rows,
        feature::FEATURES.len(),
        "a row for each feature, no more"
    );
}
