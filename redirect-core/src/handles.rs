//! The kernel's handles beneath [`Namespace`](crate::Namespace), for a program that looks at
//! a namespace piece by piece (CNI CHECK, `inspect`, the node agent): our table's ([`Nft`],
//! and [`text`] to print what it holds), the routes' and addresses' ([`Routes`]), the backend
//! that holds both ([`Live`], opened by an [`Opener`]), the steps of a check, and a
//! namespace's identity ([`NetnsId`]).

pub use redirect_kernel::backend::{open_live, Live, Opener};
pub use redirect_kernel::capture::{
    check, cleanup, compare, compare_uncaptured, routing_of, RoutesSeen,
};
pub use redirect_kernel::netns::{current_netns_id, netns_id_of, NetnsId};
pub use redirect_kernel::nft::{lower, table_flags, text, Nft, TABLE};
pub use redirect_kernel::routes::Routes;
