use std::time::Instant;
#[test]
fn timing() {
    for name in ["decomfl_opt125m_zo_fedlearn.pickle", "cs336_medium_ctx512_train_step.pickle"] {
        let bytes = std::fs::read(format!("/work/shared/traces/{name}")).unwrap();
        for _ in 0..3 {
            let t = Instant::now();
            let v = vramscope_inspector::pickle::parse(&bytes).unwrap();
            let t1 = t.elapsed();
            let s = vramscope_inspector::import::pytorch::from_value(&v, name, &Default::default()).unwrap();
            let t2 = t.elapsed();
            drop(v);
            let t3 = t.elapsed();
            println!("{name}: parse {t1:?} convert {:?} drop {:?} sites {}", t2 - t1, t3 - t2, s.sites.len());
        }
    }
    let t = Instant::now();
    let s = vramscope_inspector::import::load("/work/shared/traces/hta_ddp_rank1_v100_profile_memory.trace.json.gz").unwrap();
    println!("hta {:?} {}", t.elapsed(), s.events.len());
}
