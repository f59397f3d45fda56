//! Command metadata for `COMMAND INFO` / `COMMAND DOCS` (arity, summary, key spec, arguments),
//! set at load time from the module's one command table.

use std::ffi::{c_int, CStr};
use std::ptr;

use redis_module::{raw, Context};

/// What an argument is, as `COMMAND DOCS` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgType {
    Key,
    String,
    Integer,
    /// An option word with no value (`TOKEN`).
    PureToken,
    /// One of the sub-arguments (`READ|WRITE`).
    OneOf,
    /// The sub-arguments together, in order (`SESSION [LOCKDELAY ms]`).
    Block,
}

/// One argument of a command, for `COMMAND DOCS` (redis-cli's hints read these).
#[derive(Debug, Clone, Copy)]
pub struct ArgDoc {
    pub name: &'static CStr,
    pub kind: ArgType,
    /// The option word that introduces it (`WAIT` for `[WAIT timeout-ms]`).
    pub token: Option<&'static CStr>,
    pub optional: bool,
    /// It may be repeated (`id [id ...]`).
    pub multiple: bool,
    /// The alternatives of a [`ArgType::OneOf`].
    pub subargs: &'static [ArgDoc],
}

impl ArgDoc {
    /// A mandatory argument.
    #[must_use]
    pub const fn new(name: &'static CStr, kind: ArgType) -> Self {
        Self { name, kind, token: None, optional: false, multiple: false, subargs: &[] }
    }

    /// The same argument, optional.
    #[must_use]
    pub const fn optional(mut self) -> Self {
        self.optional = true;
        self
    }

    /// The same argument, repeatable (`id [id ...]`; after a token, the token comes once).
    #[must_use]
    pub const fn multiple(mut self) -> Self {
        self.multiple = true;
        self
    }

    /// The same argument, introduced by the option word `token`.
    #[must_use]
    pub const fn token(mut self, token: &'static CStr) -> Self {
        self.token = Some(token);
        self
    }

    /// One of `subargs`.
    #[must_use]
    pub const fn one_of(name: &'static CStr, subargs: &'static [ArgDoc]) -> Self {
        Self { name, kind: ArgType::OneOf, token: None, optional: false, multiple: false, subargs }
    }

    /// `subargs` together, in order: an option that only comes with another.
    #[must_use]
    pub const fn block(name: &'static CStr, subargs: &'static [ArgDoc]) -> Self {
        Self { name, kind: ArgType::Block, token: None, optional: false, multiple: false, subargs }
    }
}

/// Command metadata for `COMMAND INFO` / `COMMAND DOCS`, set at load time.
pub struct CommandDoc {
    pub name: &'static CStr,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    /// Redis arity: N exactly, or -N for at least N (the command name counts).
    pub arity: i32,
    /// `REDISMODULE_CMD_KEY_*` flags of the one key, at position 1.
    pub key_flags: u64,
    /// The arguments after the command name, in order.
    pub args: &'static [ArgDoc],
}

/// Key-spec flags (redismodule.h).
pub const KEY_RO: u64 = raw::REDISMODULE_CMD_KEY_RO as u64;
pub const KEY_RW: u64 = raw::REDISMODULE_CMD_KEY_RW as u64;
pub const KEY_ACCESS: u64 = raw::REDISMODULE_CMD_KEY_ACCESS as u64;
pub const KEY_UPDATE: u64 = raw::REDISMODULE_CMD_KEY_UPDATE as u64;
pub const KEY_DELETE: u64 = raw::REDISMODULE_CMD_KEY_DELETE as u64;

static COMMAND_INFO_VERSION: raw::RedisModuleCommandInfoVersion =
    raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
    };

/// Sets a registered command's arity, docs, key spec (one key at argument 1 with `key_flags`)
/// and arguments. On Redis 7.0 this is what makes a read-only key permission (`%R~`) enough for
/// the read-only commands. A no-op on servers without `SetCommandInfo` (before 7.0).
///
/// # Errors
/// A message for the log when the command is unknown or Redis refuses the info.
pub fn set_command_info(ctx: &Context, doc: &CommandDoc) -> Result<(), String> {
    let (Some(get_command), Some(set_info)) =
        (optional_api!(RedisModule_GetCommand), optional_api!(RedisModule_SetCommandInfo))
    else {
        return Ok(());
    };
    // SAFETY: live context at load time and a NUL-terminated name.
    let command = unsafe { get_command(ctx.get_raw(), doc.name.as_ptr()) };
    if command.is_null() {
        return Err(format!("{:?} is not registered", doc.name));
    }
    // Two key specs: ours, then the all-zero terminator Redis looks for.
    let spec = raw::RedisModuleCommandKeySpec {
        notes: ptr::null(),
        flags: doc.key_flags,
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 },
        },
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                lastkey: 0,
                keystep: 1,
                limit: 0,
            },
        },
    };
    // SAFETY: an all-zero key spec is the terminator (null pointers, zero flags, INVALID/OMITTED
    // search types), a valid value of this plain C struct.
    let terminator: raw::RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    let mut specs = [spec, terminator];
    let mut arrays = ArgArrays::default();
    let args = arrays.build(doc.args);
    let info = raw::RedisModuleCommandInfo {
        version: &COMMAND_INFO_VERSION,
        summary: doc.summary.as_ptr(),
        complexity: doc.complexity.as_ptr(),
        since: c"0.1.0".as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        arity: doc.arity,
        key_specs: specs.as_mut_ptr(),
        args,
    };
    // SAFETY: `command` belongs to this module; `info` and everything it points to (static C
    // strings, the version struct, the terminated key-spec array on our stack, the terminated
    // argument arrays owned by `ArgArrays` until the end of this function) are valid for the
    // call, and SetCommandInfo copies what it keeps.
    let status = unsafe { set_info(command, &info) };
    if status == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err(format!("Redis refused the command info of {:?}", doc.name))
    }
}

/// The C argument arrays of one command, each terminated by an all-zero entry, kept alive while
/// `SetCommandInfo` reads them.
#[derive(Default)]
struct ArgArrays {
    arrays: Vec<Vec<raw::RedisModuleCommandArg>>,
}

impl ArgArrays {
    /// The terminated array for `args` (sub-arguments first, so their pointers are stable:
    /// each array is its own heap allocation, never moved once built); NULL for no arguments.
    fn build(&mut self, args: &[ArgDoc]) -> *mut raw::RedisModuleCommandArg {
        if args.is_empty() {
            return ptr::null_mut();
        }
        let mut array: Vec<raw::RedisModuleCommandArg> = args
            .iter()
            .map(|arg| raw::RedisModuleCommandArg {
                name: arg.name.as_ptr(),
                type_: match arg.kind {
                    ArgType::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
                    ArgType::String => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
                    ArgType::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                    ArgType::PureToken => {
                        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN
                    }
                    ArgType::OneOf => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
                    ArgType::Block => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
                },
                // The one key spec (index 0) for the key; -1 for everything else.
                key_spec_index: if arg.kind == ArgType::Key { 0 } else { -1 },
                token: arg.token.map_or(ptr::null(), CStr::as_ptr),
                summary: ptr::null(),
                since: ptr::null(),
                flags: arg_flags(arg),
                deprecated_since: ptr::null(),
                subargs: self.build(arg.subargs),
                display_text: ptr::null(),
            })
            .collect();
        // SAFETY: an all-zero argument (NULL name) is the terminator Redis looks for, a valid
        // value of this plain C struct.
        array.push(unsafe { std::mem::zeroed() });
        let pointer = array.as_mut_ptr();
        self.arrays.push(array);
        pointer
    }
}

/// The `REDISMODULE_CMD_ARG_*` flags of an argument.
fn arg_flags(arg: &ArgDoc) -> c_int {
    let mut flags = 0;
    if arg.optional {
        flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int;
    }
    if arg.multiple {
        flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE as c_int;
    }
    flags
}
