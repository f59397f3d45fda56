//! Replies the redis-module crate's `RedisValue` cannot express: a map under RESP3 (a flat
//! field/value array under RESP2) with binary-safe values.

use redis_module::{raw, Context};

/// A value in a map reply.
pub enum Field<'a> {
    Bytes(&'a [u8]),
    Int(i64),
    Nil,
}

/// Replies a map, fields in the given order (a flat field/value array under RESP2).
pub fn reply_map(ctx: &Context, fields: &[(&str, Field<'_>)]) {
    let ctx = ctx.get_raw();
    // The crate's reply helpers are safe functions over the live command context.
    raw::reply_with_map(ctx, fields.len() as std::ffi::c_long);
    for (name, value) in fields {
        raw::reply_with_string_buffer(ctx, name.as_ptr().cast(), name.len());
        match value {
            Field::Bytes(b) => raw::reply_with_string_buffer(ctx, b.as_ptr().cast(), b.len()),
            Field::Int(n) => raw::reply_with_long_long(ctx, *n),
            Field::Nil => raw::reply_with_null(ctx),
        };
    }
}

/// Replies an array of maps, one per row (each a flat field/value array under RESP2).
pub fn reply_maps(ctx: &Context, rows: &[Vec<(&str, Field<'_>)>]) {
    // As `reply_map`: safe functions of the crate over the live command context.
    raw::reply_with_array(ctx.get_raw(), rows.len() as std::ffi::c_long);
    for row in rows {
        reply_map(ctx, row);
    }
}
