//! Checkpoints (round trip, overwrite, corruption) and the loss log (append, resume truncation).

use octoflow_train::checkpoint::{self, Checkpoint, NamedTensor};
use octoflow_train::{read_log, LossLog, TrainError};
use rand::{Rng, SeedableRng};
use serde_json::json;

fn random_checkpoint(rng: &mut impl Rng, step: u64) -> Checkpoint {
    let tensor = |name: &str, shape: Vec<u64>, rng: &mut dyn rand::RngCore| {
        let n = shape.iter().product::<u64>() as usize;
        NamedTensor {
            name: name.to_string(),
            shape,
            data: (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect(),
        }
    };
    Checkpoint {
        step,
        epoch: rng.gen_range(0..10),
        batch_in_epoch: rng.gen(),
        tokens: rng.gen(),
        config_json: json!({"lr": 2e-4, "rank": 8, "data": "data/pirate/train.jsonl"}).to_string(),
        extra: vec![("rng_seed".into(), rng.gen()), ("b".into(), u64::MAX)],
        tensors: vec![
            tensor("blk.0.attn_q.lora_a", vec![8, 576], rng),
            tensor("blk.0.attn_q.lora_b", vec![576, 8], rng),
            tensor("adam.m.blk.0.attn_q.lora_a", vec![8, 576], rng),
            tensor("odd", vec![3, 5, 7], rng),
            tensor("vector", vec![13], rng),
        ],
    }
}

#[test]
fn round_trip_and_save_over_an_existing_one() {
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("temp dir");
    let run = dir.path().join("run");
    assert!(checkpoint::load(&run).expect("no run dir").is_none());
    let first = random_checkpoint(&mut rng, 10);
    checkpoint::save(&run, &first).expect("save");
    assert_eq!(
        checkpoint::load(&run).expect("load"),
        Some(first),
        "seed {seed}"
    );
    let second = random_checkpoint(&mut rng, 20);
    checkpoint::save(&run, &second).expect("save over");
    assert_eq!(
        checkpoint::load(&run).expect("load"),
        Some(second),
        "seed {seed}"
    );
    let names: Vec<_> = std::fs::read_dir(&run)
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["checkpoint.gguf"], "no temp file left behind");
    // it is a GGUF other tools can read: ggml dims are the shape reversed
    let file = octoflow_gguf::GgufFile::open(run.join("checkpoint.gguf")).expect("GGUF");
    let t = file.tensor("blk.0.attn_q.lora_a").expect("tensor");
    assert_eq!(t.dims, [576, 8]);
    assert_eq!(t.ty, octoflow_gguf::GgmlType::F32);
    assert!(file.get("octoflow.train.step").is_some());
}

fn load_error(run: &std::path::Path) -> String {
    match checkpoint::load(run) {
        Err(e @ TrainError::Checkpoint { .. }) => e.to_string(),
        other => panic!("expected a checkpoint error, got {other:?}"),
    }
}

#[test]
fn truncated_or_corrupt_checkpoint_is_an_error_naming_the_file() {
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("temp dir");
    checkpoint::save(dir.path(), &random_checkpoint(&mut rng, 1)).expect("save");
    let path = dir.path().join("checkpoint.gguf");
    let bytes = std::fs::read(&path).expect("read");
    for cut in [0, 3, 100, bytes.len() / 2, bytes.len() - 64] {
        std::fs::write(&path, &bytes[..cut]).expect("truncate");
        let e = load_error(dir.path());
        assert!(e.contains("checkpoint.gguf"), "cut {cut}: {e}");
    }
    // one flipped bit in the tensor data: the last tensor ("vector", 13 f32 = 52 bytes) ends
    // the file, padded to the 32-byte alignment (the padding is not data)
    let mut flipped = bytes.clone();
    let start = bytes.len() - 52usize.next_multiple_of(32);
    let at = rng.gen_range(start..start + 52);
    flipped[at] ^= 0x10;
    std::fs::write(&path, &flipped).expect("corrupt");
    let e = load_error(dir.path());
    assert!(e.contains("checksum"), "seed {seed}, byte {at}: {e}");
}

#[test]
fn bad_tensor_shape_is_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut ck = random_checkpoint(&mut rand::rngs::StdRng::seed_from_u64(1), 1);
    ck.tensors[3].shape = vec![3, 5, 8];
    let e = checkpoint::save(dir.path(), &ck).expect_err("shape mismatch");
    assert!(e.to_string().contains("\"odd\""), "{e}");
    ck.tensors[3].shape = vec![];
    assert!(checkpoint::save(dir.path(), &ck).is_err());
    assert!(
        checkpoint::load(dir.path()).expect("load").is_none(),
        "nothing written"
    );
}

#[test]
fn log_appends_and_truncates_on_resume() {
    let dir = tempfile::tempdir().expect("temp dir");
    let run = dir.path().join("run");
    assert!(read_log(&run).expect("no log").is_empty());
    let mut log = LossLog::open(&run, None).expect("open");
    for step in 1..=6u64 {
        log.append(&json!({"step": step, "loss": 3.0 / step as f64, "lr": 1e-4}))
            .expect("append");
        if step % 2 == 0 {
            log.append(&json!({"step": step, "eval_loss": 2.5}))
                .expect("append");
        }
    }
    drop(log);
    assert_eq!(read_log(&run).expect("read").len(), 9);
    // a crash tore the last line
    let path = run.join("log.jsonl");
    let mut text = std::fs::read_to_string(&path).expect("read");
    text.push_str("{\"step\": 7, \"lo");
    std::fs::write(&path, text).expect("write");
    assert_eq!(read_log(&run).expect("torn tail ignored").len(), 9);
    // resuming from the checkpoint of step 4 drops later lines and the torn one
    let mut log = LossLog::open(&run, Some(4)).expect("resume");
    let steps: Vec<u64> = read_log(&run)
        .expect("read")
        .iter()
        .map(|v| v["step"].as_u64().expect("step"))
        .collect();
    assert_eq!(steps, [1, 2, 2, 3, 4, 4]);
    log.append(&json!({"step": 5, "loss": 0.5}))
        .expect("append");
    let all = read_log(&run).expect("read");
    assert_eq!(all.len(), 7);
    assert_eq!(all[6], json!({"step": 5, "loss": 0.5}));
    // a fresh start empties it
    drop(LossLog::open(&run, None).expect("fresh"));
    assert!(read_log(&run).expect("read").is_empty());
    // a bad line in the middle names its line
    std::fs::write(&path, "{\"step\": 1}\n[1, 2]\n{\"step\": 2}\n").expect("write");
    let e = read_log(&run).expect_err("not an object");
    assert!(e.to_string().contains("log.jsonl:2"), "{e}");
}
