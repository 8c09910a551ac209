use std::time::{Duration, Instant};
#[test]
fn timing() {
    for name in ["decomfl_opt125m_zo_fedlearn.pickle", "cs336_medium_ctx512_train_step.pickle", "hta_ddp_rank1_v100_profile_memory.trace.json.gz"] {
        let path = format!("/work/shared/traces/{name}");
        let bytes = std::fs::read(&path).unwrap();
        let (mut p, mut c, mut l) = (Duration::MAX, Duration::MAX, Duration::MAX);
        for _ in 0..8 {
            if name.ends_with("pickle") {
                let t = Instant::now();
                let v = vramscope_inspector::pickle::parse(&bytes).unwrap();
                p = p.min(t.elapsed());
                let t = Instant::now();
                let _s = vramscope_inspector::import::pytorch::from_value(&v, name, &Default::default()).unwrap();
                c = c.min(t.elapsed());
            }
            let t = Instant::now();
            let _s = vramscope_inspector::import::load(&path).unwrap();
            l = l.min(t.elapsed());
        }
        println!("{name}: parse {p:?} convert {c:?} load {l:?}");
    }
}
