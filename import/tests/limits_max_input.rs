//! The ceiling on input size is configurable (issue 18): `VRAMSCOPE_MAX_INPUT` sets it for a
//! process, `import::set_default_max_input` (what the file commands' `--max-input` calls)
//! overrides that, and the defaults of `ImportOptions` and the pickle reader's limits follow.
//! One test in its own binary, since it changes the process's environment.

use vramscope_import::{self as import, ImportErrorKind, ImportOptions};

#[test]
fn the_ceiling_comes_from_the_flag_then_the_environment_then_the_default() {
    std::env::remove_var(import::MAX_INPUT_ENV);
    assert_eq!(ImportOptions::default().max_file_bytes, 4 << 30);
    assert_eq!(ImportOptions::default().max_decompressed_bytes, 4 << 30);

    std::env::set_var(import::MAX_INPUT_ENV, "8GiB");
    assert_eq!(ImportOptions::default().max_file_bytes, 8 << 30);
    let limits = import::pytorch::limits(&ImportOptions::default());
    assert_eq!(limits.max_input_bytes, 8 << 30);

    // Not a size: the default stays, with one line on standard error.
    std::env::set_var(import::MAX_INPUT_ENV, "lots");
    assert_eq!(ImportOptions::default().max_file_bytes, 4 << 30);

    std::env::set_var(import::MAX_INPUT_ENV, "100");
    let e = import::load_bytes(&[0x80; 101], "big.pickle", &ImportOptions::default()).unwrap_err();
    assert!(
        matches!(
            e.kind,
            ImportErrorKind::TooLarge {
                limit: 100,
                size: Some(101),
                ..
            }
        ),
        "{e}"
    );

    // The flag wins over the environment.
    import::set_default_max_input(1 << 40);
    assert_eq!(ImportOptions::default().max_file_bytes, 1 << 40);
    assert_eq!(ImportOptions::default().max_decompressed_bytes, 1 << 40);
}
