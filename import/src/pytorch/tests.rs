//! Tests of the PyTorch importer: snapshot pickles built here, read to the model.

use super::*;

#[test]
fn reads_pytorch_settings() {
    let settings = vramscope_pickle::parse(
        // {'PYTORCH_CUDA_ALLOC_CONF': 'backend:native,max_split_size_mb:64',
        //  'max_split_size': 67108864, 'garbage_collection_threshold': 0.0,
        //  'expandable_segments': True, 'roundup_power2_divisions': {'1': 0, '2': 4},
        //  'unknown': 1}
        b"\x80\x04\x95\xd1\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x17PYTORCH_CUDA_ALLOC_CONF\x94\x8c#backend:native,max_split_size_mb:64\x94\x8c\x0emax_split_size\x94J\x00\x00\x00\x04\x8c\x1cgarbage_collection_threshold\x94G\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x13expandable_segments\x94\x88\x8c\x18roundup_power2_divisions\x94}\x94(\x8c\x011\x94K\x00\x8c\x012\x94K\x04u\x8c\x07unknown\x94K\x01u.",
    )
    .unwrap();
    let config = read_config(Some(&settings));
    assert_eq!(config.max_split_size, Some(64 << 20));
    assert_eq!(config.garbage_collection_threshold, None);
    assert!(config.expandable_segments);
    assert_eq!(config.roundup_power2_divisions, 4);
}

/// The keys of an entry are found wherever they stand in its dict: in the order of the
/// entry before (remembered by place), in another order, beside keys that are not read,
/// and as strings of their own rather than the ones the entries share.
#[test]
fn entry_keys_are_found_in_any_order() {
    use vramscope_pickle::Document;
    use vramscope_pickle::PickleWriter;
    let mut w = PickleWriter::new();
    let mut shared = FxHashMap::default();
    let entries: [&[(&str, u64)]; 4] = [
        &[("action", 0), ("addr", 16), ("size", 512), ("stream", 7)],
        &[("action", 0), ("addr", 32), ("size", 1024), ("stream", 8)],
        &[
            ("size", 2048),
            ("extra", 5),
            ("stream", 9),
            ("addr", 48),
            ("action", 0),
        ],
        &[("addr", 64), ("size", 4096), ("action", 0), ("stream", 10)],
    ];
    w.begin_list();
    for (i, entry) in entries.iter().enumerate() {
        w.begin_dict();
        for &(key, value) in entry.iter() {
            // The last entry's keys are strings of their own.
            if i == 3 {
                w.str(key);
            } else {
                w.shared_str(key, &mut shared);
            }
            if key == "action" {
                w.shared_str("alloc", &mut shared);
            } else {
                w.uint(value);
            }
        }
        w.end_dict();
    }
    w.end_list();
    let doc = Document::parse(&w.finish()).unwrap();
    let mut keys = EntryKeys::default();
    let list = doc.root().as_seq().unwrap();
    for (entry, expected) in list.iter().zip(entries) {
        let [action, addr, size, stream, time_us, frames, device_free, user_metadata] =
            keys.fields(entry);
        let value = |key: &str| expected.iter().find(|(k, _)| *k == key).unwrap().1;
        assert_eq!(action.and_then(|v| v.as_str()), Some("alloc"));
        assert_eq!(addr.and_then(|v| v.as_u64()), Some(value("addr")));
        assert_eq!(size.and_then(|v| v.as_u64()), Some(value("size")));
        assert_eq!(stream.and_then(|v| v.as_u64()), Some(value("stream")));
        assert!(time_us.is_none() && frames.is_none() && device_free.is_none());
        assert!(user_metadata.is_none());
    }
}

/// The phase timings' CPU figure reads this process's user and system time from
/// `/proc/self/stat`, which grows as the process works.
#[test]
fn the_process_cpu_time_is_read_and_grows() {
    if !std::path::Path::new("/proc/self/stat").exists() {
        println!("skipped: no /proc/self/stat on this system, so the phases print no CPU time");
        return;
    }
    let before = process_cpu_ticks().expect("/proc/self/stat holds utime and stime");
    // Work until a clock tick (10 ms) has been counted, or give up after a generous bound.
    let started = std::time::Instant::now();
    let mut sum = 0u64;
    let mut after = before;
    while after == before && started.elapsed() < std::time::Duration::from_secs(30) {
        for k in 0..100_000u64 {
            sum = sum.wrapping_add(std::hint::black_box(k * k));
        }
        after = process_cpu_ticks().expect("read again");
    }
    std::hint::black_box(sum);
    assert!(after > before, "the CPU time grew: {before} -> {after}");
    assert!(phase_memory().contains(", cpu "), "{}", phase_memory());
}
