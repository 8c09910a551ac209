//! Use-after-free and overflow detection (`debug` and `guard_bytes` settings) on the backed
//! simulated device: a stale write is found when the memory is handed out again, an overflow
//! when the block is freed, each naming the owners by call site, tag and step.

use vramscope_caching::{Backend, CachingAllocator, SimDevice, StreamId};
use vramscope_model::{AllocatorConfig, ViolationKind};

fn backed(conf: &str) -> (SimDevice, CachingAllocator<SimDevice>) {
    let device = SimDevice::backed(64 << 20);
    let alloc = CachingAllocator::new(device.clone(), AllocatorConfig::parse(conf).unwrap());
    (device, alloc)
}

#[test]
fn a_write_after_free_is_found_on_reuse_with_both_owners() {
    let (device, alloc) = backed("debug:True");
    alloc.mark_step();
    let first = alloc.tagged("activations").alloc(4096).unwrap();
    let first_line = line!() - 1;
    let stale = first.addr();
    drop(first);
    // A kernel still holding the old pointer writes into freed memory.
    device
        .copy_host_to_device(stale + 100, &[1, 2, 3], StreamId::DEFAULT)
        .unwrap();
    alloc.mark_step();
    let second = alloc.alloc(4096).unwrap();
    let second_line = line!() - 1;
    assert_eq!(second.addr(), stale, "the freed block is reused");
    let violations = alloc.violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    let v = &violations[0];
    assert_eq!(v.kind, ViolationKind::UseAfterFree);
    assert_eq!(v.address, stale + 100);
    assert_eq!(v.bytes, 3);
    let snapshot = alloc.snapshot();
    let previous = v.previous_owner.unwrap();
    assert_eq!(snapshot.site(previous.site).unwrap().line, first_line);
    assert_eq!(snapshot.tag(previous.tag), Some("activations"));
    assert_eq!(previous.step, 1);
    let new = v.new_owner.unwrap();
    assert_eq!(snapshot.site(new.site).unwrap().line, second_line);
    assert_eq!(new.step, 2);
    assert_eq!(snapshot.violations, violations);
}

#[test]
fn an_overflow_into_the_guard_bytes_is_found_on_free() {
    let (device, alloc) = backed("guard_bytes:64");
    let buffer = alloc.alloc(100).unwrap();
    let line = line!() - 1;
    let addr = buffer.addr();
    // Write 8 bytes past the end of the 100 requested.
    device
        .copy_host_to_device(addr, &[7u8; 108], StreamId::DEFAULT)
        .unwrap();
    drop(buffer);
    let violations = alloc.violations();
    assert_eq!(violations.len(), 1);
    let v = &violations[0];
    assert_eq!(v.kind, ViolationKind::Overflow);
    assert_eq!(v.address, addr + 100);
    assert_eq!(v.bytes, 8);
    let snapshot = alloc.snapshot();
    let owner = v.previous_owner.unwrap();
    assert_eq!(snapshot.site(owner.site).unwrap().line, line);
}

#[test]
fn correct_programs_raise_nothing_and_phantom_devices_skip_the_checks() {
    let (_, alloc) = backed("debug:True,guard_bytes:32");
    for i in 0..50u64 {
        let mut a = alloc.alloc(1000 + i * 64).unwrap();
        a.copy_from_host(&vec![9u8; 1000]).unwrap();
        let b = alloc.alloc(3 << 20).unwrap();
        drop(a);
        drop(b);
    }
    alloc.empty_cache();
    assert!(alloc.violations().is_empty(), "{:?}", alloc.violations());
    alloc.check_invariants().unwrap();

    let phantom = CachingAllocator::new(
        SimDevice::phantom(1 << 30),
        AllocatorConfig::parse("debug:True,guard_bytes:16").unwrap(),
    );
    drop(phantom.alloc(4096).unwrap());
    drop(phantom.alloc(4096).unwrap());
    assert!(phantom.violations().is_empty());
}
