#[test]
fn parse_only() {
    let bytes = std::fs::read("/work/shared/traces/cs336_medium_ctx512_train_step.pickle").unwrap();
    for _ in 0..30 { let v = vramscope_inspector::pickle::parse(&bytes).unwrap(); std::hint::black_box(&v); }
}
