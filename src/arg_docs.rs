//! The arguments the command table documents (`COMMAND DOCS`), shared by the commands that take
//! them: one place, so two commands never describe one argument two ways.

use crate::raw::command_info::{ArgDoc, ArgType};

pub(crate) const KEY: ArgDoc = ArgDoc::new(c"key", ArgType::Key);
pub(crate) const OWNER: ArgDoc = ArgDoc::new(c"owner", ArgType::String);
pub(crate) const LEASE: ArgDoc = ArgDoc::new(c"lease-ms", ArgType::Integer);
pub(crate) const MODE: ArgDoc = ArgDoc::one_of(
    c"mode",
    &[
        ArgDoc::new(c"read", ArgType::PureToken).token(c"READ"),
        ArgDoc::new(c"write", ArgType::PureToken).token(c"WRITE"),
    ],
);
pub(crate) const WAIT: ArgDoc =
    ArgDoc::new(c"timeout-ms", ArgType::Integer).token(c"WAIT").optional();
pub(crate) const TOKEN: ArgDoc =
    ArgDoc::new(c"token", ArgType::PureToken).token(c"TOKEN").optional();
pub(crate) const REQUEST: ArgDoc = ArgDoc::new(c"id", ArgType::String).token(c"REQUEST").optional();
/// `[REQUEST id [OWNERLESS]]`: `OWNERLESS`, counted permits that will be released ownerless
/// (their request record lasts 60 s, not until released).
pub(crate) const SEM_REQUEST: ArgDoc = ArgDoc::block(
    c"request",
    &[
        ArgDoc::new(c"id", ArgType::String).token(c"REQUEST"),
        ArgDoc::new(c"ownerless", ArgType::PureToken).token(c"OWNERLESS").optional(),
    ],
)
.optional();
/// `[GT]`: a hold the owner already has keeps the later of its lease end and the new one.
pub(crate) const GT: ArgDoc = ArgDoc::new(c"gt", ArgType::PureToken).token(c"GT").optional();
/// `[REQUEST id | ONCE id]`: the acquire whose counted permits these are, or an ownerless
/// release's own id.
const RELEASED_AS: ArgDoc = ArgDoc::one_of(
    c"released-as",
    &[
        ArgDoc::new(c"id", ArgType::String).token(c"REQUEST"),
        ArgDoc::new(c"release-id", ArgType::String).token(c"ONCE"),
    ],
)
.optional();
/// `RSEM.RELEASE`'s two forms: `permits [REQUEST id | ONCE id]`, or `ID id [id ...]`.
pub(crate) const SEM_RELEASED: ArgDoc = ArgDoc::one_of(
    c"permits-or-ids",
    &[
        ArgDoc::block(c"counted", &[ArgDoc::new(c"permits", ArgType::Integer), RELEASED_AS]),
        ArgDoc::new(c"id", ArgType::String).token(c"ID").multiple(),
    ],
);
/// `[SESSION [LOCKDELAY lockdelay-ms]]`: a lock-delay only comes with a session hold.
pub(crate) const SESSION: ArgDoc = ArgDoc::block(
    c"session-hold",
    &[
        ArgDoc::new(c"session", ArgType::PureToken).token(c"SESSION"),
        ArgDoc::new(c"lockdelay-ms", ArgType::Integer).token(c"LOCKDELAY").optional(),
    ],
)
.optional();
/// `[LEASE lease-ms [SESSION [LOCKDELAY lockdelay-ms]]]`: only a leased permit has a holder to bind.
pub(crate) const LEASED: ArgDoc = ArgDoc::block(
    c"leased",
    &[ArgDoc::new(c"lease-ms", ArgType::Integer).token(c"LEASE"), SESSION],
)
.optional();
pub(crate) const COUNT: ArgDoc = ArgDoc::new(c"count", ArgType::Integer).token(c"COUNT").optional();
