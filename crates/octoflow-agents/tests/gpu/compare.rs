//! Holding a GPU phase's words to the host's: both sides are brought to canonical words
//! (the GPU's unpacked into a run and packed again, so flag-cleared fields and the ring's
//! bookkeeping read alike), NaNs are made one NaN, and the one legitimate difference of a
//! phase — where `gen`'s atomic bump put each new span — is undone by mapping every arena
//! offset allocated during the phase to the host's, following the references both states hold
//! (last spans, feeds, task spans, queued tasks, messages; a new span with no tokens yet has
//! nothing to compare but its place, which an empty allocation even shares with the next).
//! Scores (a span's mean log-probability) may differ within [`SCORE_REL`]: the one division
//! Vulkan lets round differently. Anything else must be equal word for word; a difference is
//! named by region, record and field. (Events are compared apart, in a canonical order: `canonical_events`.)

use std::collections::BTreeMap;

use octoflow_agents::gpu_state::{pack, unpack, VmImage};
use octoflow_agents::{Event, Run};
use octoflow_kernels::agents::layout::{self as l, *};

/// The event ring every packed state gets.
pub const EVENT_CAP: u32 = 4096;

/// `gpu` (the words a kernel left) as canonical words and its events, read through `template`
/// (a run with the same program and sizes).
pub fn normalize(template: &Run, gpu: &VmImage) -> Result<(VmImage, Vec<Event>, Run), String> {
    let mut run = template.clone();
    let events = unpack(&mut run, gpu).map_err(|e| format!("unpack: {e}"))?;
    let mut img = pack(&run, EVENT_CAP).map_err(|e| format!("repack: {e}"))?;
    img.hdr[H_CHANGED as usize] = gpu.hdr[H_CHANGED as usize];
    Ok((img, events, run))
}

/// How far a GPU score may sit from the host's, relative: both sum the same log-probabilities
/// with f32 adds (exact in Vulkan), but the mean's division may be off by 2.5 ulp (3e-7).
pub const SCORE_REL: f32 = 1e-6;

/// Where `gpu`'s score words (last spans, messages) are within [`SCORE_REL`] of `host`'s at
/// the same place, takes the host's bits, so the word comparison sees them equal (the places
/// match where the structure does; elsewhere the comparison names the difference).
fn snap_scores(gpu: &mut VmImage, host: &VmImage) {
    let snap = |g: &mut u32, h: u32| {
        let (gf, hf) = (f32::from_bits(*g), f32::from_bits(h));
        if gf.is_finite() && hf.is_finite() && (gf - hf).abs() <= SCORE_REL * hf.abs() {
            *g = h;
        }
    };
    if gpu.inst.len() == host.inst.len() {
        let n = INST_WORDS as usize;
        for (g, h) in gpu.inst.chunks_exact_mut(n).zip(host.inst.chunks_exact(n)) {
            snap(&mut g[I_LAST_SCORE as usize], h[I_LAST_SCORE as usize]);
        }
    }
    if gpu.boxes.len() == host.boxes.len() {
        let n_boxes = host.hdr[H_N_BOXES as usize] as usize;
        for b in 0..n_boxes {
            let h = b * BOX_WORDS as usize;
            let (cap, slots) = (
                host.boxes[h + B_CAP as usize],
                host.boxes[h + B_SLOTS as usize],
            );
            for j in 0..cap as usize {
                let at = slots as usize + j * SLOT_WORDS as usize + S_SCORE as usize;
                if at < host.boxes.len() {
                    snap(&mut gpu.boxes[at], host.boxes[at]);
                }
            }
        }
    }
}

/// The fields holding f32 bits, per record kind.
fn canon_nans(img: &mut VmImage) {
    let canon = |w: &mut u32| {
        if f32::from_bits(*w).is_nan() {
            *w = f32::NAN.to_bits();
        }
    };
    for rec in img.inst.chunks_exact_mut(INST_WORDS as usize) {
        for f in [I_PRE_LOGPROB, I_LAST_SCORE, I_GEN_LOGPROB_SUM] {
            canon(&mut rec[f as usize]);
        }
    }
    let n_boxes = img.hdr[H_N_BOXES as usize] as usize;
    for b in 0..n_boxes {
        let h = b * BOX_WORDS as usize;
        let (cap, slots) = (
            img.boxes[h + B_CAP as usize],
            img.boxes[h + B_SLOTS as usize],
        );
        for j in 0..cap as usize {
            canon(&mut img.boxes[slots as usize + j * SLOT_WORDS as usize + S_SCORE as usize]);
        }
    }
}

/// Every word of `img` that holds an arena offset, with the extent of tokens it names, as
/// (region, index, extent): region 0 instances, 1 queues, 2 mailboxes.
fn offset_fields(img: &VmImage) -> Vec<(usize, usize, u32)> {
    let mut out = Vec::new();
    for (k, rec) in img.inst.chunks_exact(INST_WORDS as usize).enumerate() {
        let at = |f: u32| k * INST_WORDS as usize + f as usize;
        if rec[I_HAS_LAST as usize] != 0 {
            out.push((0, at(I_LAST_OFFSET), rec[I_LAST_GENERATED as usize]));
        }
        if rec[I_HAS_TASK_SPAN as usize] != 0 {
            out.push((0, at(I_TASK_OFFSET), rec[I_TASK_LEN as usize]));
        }
        out.push((0, at(I_FEED_OFFSET), rec[I_FEED_LEN as usize]));
    }
    for q in 0..img.hdr[H_N_QUEUES as usize] as usize {
        let h = q * QUEUE_WORDS as usize;
        let (items, len) = (
            img.queues[h + Q_ITEMS as usize],
            img.queues[h + Q_LEN as usize],
        );
        for j in 0..len as usize {
            let t = items as usize + j * TASK_WORDS as usize;
            out.push((
                1,
                t + TASK_OFFSET as usize,
                img.queues[t + TASK_LEN as usize],
            ));
        }
    }
    for b in 0..img.hdr[H_N_BOXES as usize] as usize {
        let h = b * BOX_WORDS as usize;
        let (cap, slots) = (
            img.boxes[h + B_CAP as usize],
            img.boxes[h + B_SLOTS as usize],
        );
        for j in 0..cap as usize {
            let s = slots as usize + j * SLOT_WORDS as usize;
            if img.boxes[s + S_CLAIM as usize] != 0 {
                out.push((
                    2,
                    s + S_OFFSET as usize,
                    img.boxes[s + S_GENERATED as usize],
                ));
            }
        }
    }
    out
}

fn region_mut(img: &mut VmImage, r: usize) -> &mut Vec<u32> {
    match r {
        0 => &mut img.inst,
        1 => &mut img.queues,
        _ => &mut img.boxes,
    }
}

/// Compares canonical `gpu` with `host` after a phase that began with `used_before` arena
/// tokens taken. `Err` names the first difference.
pub fn compare(mut gpu: VmImage, mut host: VmImage, used_before: u32) -> Result<(), String> {
    canon_nans(&mut gpu);
    canon_nans(&mut host);
    snap_scores(&mut gpu, &host);
    let (gf, hf) = (offset_fields(&gpu), offset_fields(&host));
    if gf.len() != hf.len() || gf.iter().zip(&hf).any(|(g, h)| (g.0, g.1) != (h.0, h.1)) {
        // The structure differs: the word comparison below names where.
        return diff(&gpu, &host);
    }
    // GPU offset -> host offset for spans allocated in the phase, and each one's extent.
    let mut map: BTreeMap<u32, (u32, u32)> = BTreeMap::new();
    for (&(r, i, gext), &(_, _, hext)) in gf.iter().zip(&hf) {
        let g = region_mut(&mut gpu, r)[i];
        let h = region_mut(&mut host, r)[i];
        if g >= used_before && h >= used_before && gext == 0 && hext == 0 {
            // A span of no tokens yet: its offset is all it has, and an empty allocation
            // shares it with the next one; where it lies is the bump's business (the
            // contention test checks allocations are disjoint).
            region_mut(&mut gpu, r)[i] = u32::MAX;
            region_mut(&mut host, r)[i] = u32::MAX;
        } else if g >= used_before && h >= used_before {
            let entry = map.entry(g).or_insert((h, 0));
            if entry.0 != h {
                return Err(format!(
                    "GPU span {g} stands for host spans {} and {h}",
                    entry.0
                ));
            }
            entry.1 = entry.1.max(gext).max(hext);
            region_mut(&mut gpu, r)[i] = h;
        }
    }
    let mut seen = BTreeMap::new();
    for (&g, &(h, ext)) in &map {
        if let Some(other) = seen.insert(h, g) {
            return Err(format!(
                "host span {h} stands for GPU spans {other} and {g}"
            ));
        }
        let (g, h, ext) = (g as usize, h as usize, ext as usize);
        let (ga, ha) = (gpu.arena.get(g..g + ext), host.arena.get(h..h + ext));
        if ga != ha {
            return Err(format!(
                "span at host offset {h}: GPU tokens {ga:?}, host {ha:?}"
            ));
        }
    }
    let used = used_before as usize;
    gpu.arena[used..].fill(0);
    host.arena[used..].fill(0);
    diff(&gpu, &host)
}

/// The name of constant `value` among those starting with `prefix`.
fn field(prefix: &str, value: u32) -> String {
    if prefix == "I_" && (I_REGS..I_REGS + N_REGS).contains(&value) {
        return format!("r{}", value - I_REGS);
    }
    l::ALL
        .iter()
        .find(|(n, v)| n.starts_with(prefix) && !n.ends_with("_WORDS") && *v == value)
        .map_or(format!("word {value}"), |(n, _)| n.to_string())
}

/// Where word `w` of a headers-then-records region is.
fn locate(
    words: &[u32],
    n: u32,
    head: u32,
    base_field: u32,
    rec: u32,
    pre: [&str; 2],
    w: usize,
) -> String {
    let heads = (n * head) as usize;
    if w < heads {
        return format!(
            "{} {} {}",
            &pre[0][..1],
            w / head as usize,
            field(pre[0], (w % head as usize) as u32)
        );
    }
    for k in (0..n as usize).rev() {
        let base = words[k * head as usize + base_field as usize] as usize;
        if w >= base {
            let j = (w - base) / rec as usize;
            let f = ((w - base) % rec as usize) as u32;
            return format!("{} {k} record {j} {}", &pre[0][..1], field(pre[1], f));
        }
    }
    format!("word {w}")
}

fn diff(gpu: &VmImage, host: &VmImage) -> Result<(), String> {
    let regions: [(&str, &Vec<u32>, &Vec<u32>); 8] = [
        ("header", &gpu.hdr, &host.hdr),
        ("program", &gpu.prog, &host.prog),
        ("instances", &gpu.inst, &host.inst),
        ("arena", &gpu.arena, &host.arena),
        ("tables", &gpu.tables, &host.tables),
        ("queues", &gpu.queues, &host.queues),
        ("mailboxes", &gpu.boxes, &host.boxes),
        ("events", &gpu.events, &host.events),
    ];
    for (name, g, h) in regions {
        if g.len() != h.len() {
            return Err(format!(
                "{name}: {} GPU words, {} host words",
                g.len(),
                h.len()
            ));
        }
        let Some(w) = (0..g.len()).find(|&w| g[w] != h[w]) else {
            continue;
        };
        let hd = &host.hdr;
        let place = match name {
            "header" => field("H_", w as u32),
            "instances" => format!(
                "instance {} {}",
                w / INST_WORDS as usize,
                field("I_", (w % INST_WORDS as usize) as u32)
            ),
            "queues" => locate(
                h,
                hd[H_N_QUEUES as usize],
                QUEUE_WORDS,
                Q_ITEMS,
                TASK_WORDS,
                ["Q_", "TASK_"],
                w,
            ),
            "mailboxes" => locate(
                h,
                hd[H_N_BOXES as usize],
                BOX_WORDS,
                B_SLOTS,
                SLOT_WORDS,
                ["B_", "S_"],
                w,
            ),
            _ => format!("word {w}"),
        };
        return Err(format!(
            "{name}, {place}: GPU {:#x} ({}), host {:#x} ({})",
            g[w], g[w], h[w], h[w]
        ));
    }
    Ok(())
}

/// Events in a canonical order: by instance, each instance's in the order it made them (the
/// GPU's ring interleaves instances in any order). An `arena full` error's count of tokens
/// taken is the arena's use when that `gen` ran, which depends on how many of the same step's
/// other allocations came first (docs/VM.md, "Where the GPU may differ"): it is left out.
pub fn canonical_events(mut events: Vec<Event>) -> String {
    let key = |e: &Event| match e {
        Event::Output { instance, .. } | Event::Error { instance, .. } => *instance,
    };
    events.sort_by_key(key);
    for e in &mut events {
        if let Event::Error { message, .. } = e {
            *message = without_arena_use(message);
        }
    }
    format!("{events:#?}")
}

/// `... arena full: N more tokens asked, U of C taken` with `U` replaced by `_`.
fn without_arena_use(message: &str) -> String {
    let Some(at) = message.find("arena full: ") else {
        return message.to_string();
    };
    let tail = &message[at..];
    match (tail.find("asked, "), tail.find(" of ")) {
        (Some(a), Some(o)) if a + 7 <= o => {
            format!("{}{}_{}", &message[..at], &tail[..a + 7], &tail[o..])
        }
        _ => message.to_string(),
    }
}
