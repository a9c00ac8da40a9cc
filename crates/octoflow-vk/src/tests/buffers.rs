use rand::Rng;

use super::{random_f32, rng};
use crate::testing::{assert_no_validation_errors, gpu_or_skip};
use crate::{Buffer, ChunkedBuffer, MemoryKind, VkError};

#[test]
fn device_buffer_round_trips_random_data() {
    let Some(ctx) = gpu_or_skip("device_buffer_round_trips") else {
        return;
    };
    let (seed, mut r) = rng();
    let data = random_f32(&mut r, 100_003);
    let buf = Buffer::new(
        &ctx,
        "roundtrip",
        4 * data.len() as u64,
        MemoryKind::DeviceLocal,
    )
    .unwrap();
    ctx.upload(&buf, 0, &data).unwrap();
    let mut back = vec![f32::NAN; data.len()];
    ctx.download(&buf, 0, &mut back).unwrap();
    assert!(back == data, "seed {seed}");
    assert_no_validation_errors(&ctx);
}

#[test]
fn staging_paths_round_trip_at_an_offset() {
    let Some(ctx) = gpu_or_skip("staging_paths_round_trip") else {
        return;
    };
    let (seed, mut r) = rng();
    let data: Vec<u8> = (0..10_000).map(|_| r.gen()).collect();
    let buf = Buffer::new(&ctx, "staged", 20_000, MemoryKind::DeviceLocal).unwrap();
    ctx.upload_staged(&buf, 4_000, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    ctx.download_staged(&buf, 4_000, &mut back).unwrap();
    assert!(back == data, "seed {seed}");
    assert_no_validation_errors(&ctx);
}

#[test]
fn fill_and_copy_write_the_expected_bytes() {
    let Some(ctx) = gpu_or_skip("fill_and_copy") else {
        return;
    };
    let a = Buffer::new(&ctx, "a", 64, MemoryKind::DeviceLocal).unwrap();
    let b = Buffer::new(&ctx, "b", 64, MemoryKind::Readback).unwrap();
    ctx.fill(&a, 0, 64, 0xdead_beef).unwrap();
    ctx.fill(&a, 16, 16, 7).unwrap();
    ctx.copy(&a, 8, &b, 0, 32).unwrap();
    let mut out = [0u32; 8];
    b.read(0, &mut out).unwrap();
    assert_eq!(
        out,
        [
            0xdead_beef,
            0xdead_beef,
            7,
            7,
            7,
            7,
            0xdead_beef,
            0xdead_beef
        ]
    );
    assert!(matches!(
        ctx.fill(&a, 2, 8, 0),
        Err(VkError::BadRange { .. })
    ));
}

#[test]
fn out_of_range_access_is_a_clear_error_naming_the_buffer() {
    let Some(ctx) = gpu_or_skip("out_of_range_access") else {
        return;
    };
    let buf = Buffer::new(&ctx, "kv_cache.k", 16, MemoryKind::Upload).unwrap();
    let err = buf.write(8, &[1u32, 2, 3]).unwrap_err();
    assert!(
        err.to_string().contains("kv_cache.k") && err.to_string().contains("8+12"),
        "{err}"
    );
    assert!(buf.slice(0, 17).is_err());
    let err = Buffer::new(&ctx, "empty", 0, MemoryKind::DeviceLocal).unwrap_err();
    assert!(matches!(err, VkError::EmptyBuffer { .. }), "{err}");
}

#[test]
fn a_buffer_over_the_device_limit_is_refused_with_the_limit_named() {
    let Some(ctx) = gpu_or_skip("buffer_over_the_device_limit") else {
        return;
    };
    let too_big = ctx.caps().max_buffer_bytes() + 4;
    let err = Buffer::new(&ctx, "token_embd", too_big, MemoryKind::DeviceLocal).unwrap_err();
    match &err {
        VkError::BufferTooLarge {
            what,
            requested,
            limit,
            ..
        } => {
            assert_eq!((what.as_str(), *requested), ("token_embd", too_big));
            assert!(*limit < too_big);
        }
        other => panic!("expected BufferTooLarge, got {other}"),
    }
    assert!(err.to_string().contains("ChunkedBuffer"), "{err}");
}

#[test]
fn data_larger_than_the_stated_limit_is_split_and_round_trips_across_chunks() {
    let Some(ctx) = gpu_or_skip("data_larger_than_the_limit_is_split") else {
        return;
    };
    let (seed, mut r) = rng();
    let row = 4096u64;
    let total = 3 * (1 << 20) + (1 << 19) + 8;
    let chunked = ChunkedBuffer::with_limit(
        &ctx,
        "weights",
        total,
        row,
        1 << 20,
        MemoryKind::DeviceLocal,
    )
    .unwrap();
    assert_eq!(chunked.chunks().len(), 4);
    assert!(chunked
        .chunks()
        .iter()
        .all(|c| c.size() <= 1 << 20 && c.size() > 0));
    assert!(chunked.ranges().iter().all(|rg| rg.start % row == 0));
    let data = random_f32(&mut r, (total / 4) as usize);
    chunked.upload(&ctx, 0, &data).unwrap();
    let mut back = vec![f32::NAN; data.len()];
    chunked.download(&ctx, 0, &mut back).unwrap();
    assert!(back == data, "seed {seed}");
    // A piece straddling chunks 0 and 1 reads back too; a binding may not straddle.
    let mut mid = vec![0f32; 100];
    chunked.download(&ctx, (1 << 20) - 200, &mut mid).unwrap();
    assert_eq!(
        &mid[..],
        &data[(((1 << 20) - 200) / 4) as usize..][..100],
        "seed {seed}"
    );
    assert!(chunked.slice((1 << 20) - 8, 16).is_err());
    let s = chunked.slice(1 << 20, 64).unwrap();
    assert_eq!((s.buffer.name(), s.offset), ("weights[1]", 0));
}

#[test]
fn dropping_buffers_returns_their_memory() {
    let Some(ctx) = gpu_or_skip("dropping_buffers_returns_their_memory") else {
        return;
    };
    let before = ctx.memory_usage().0;
    let bufs: Vec<Buffer> = (0..10)
        .map(|i| {
            Buffer::new(
                &ctx,
                &format!("b{i}"),
                (i + 1) << 16,
                MemoryKind::DeviceLocal,
            )
            .unwrap()
        })
        .collect();
    let big = Buffer::new(&ctx, "dedicated", 40 << 20, MemoryKind::DeviceLocal).unwrap();
    assert!(ctx.memory_usage().0 > before);
    drop(bufs);
    drop(big);
    assert_eq!(ctx.memory_usage().0, before);
}
