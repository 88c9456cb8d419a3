//! `expressfs-gen-docs OUT_DIR`: writes expressfs.1 and expressfs-warm.1 (man pages) and bash/zsh completions
//! generated from the same clap definitions the daemon parses, so they never drift from `--help`.

use clap::CommandFactory;

fn main() -> std::io::Result<()> {
    let out = std::path::PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "target/assets".into()),
    );
    std::fs::create_dir_all(&out)?;
    let cmd = expressfs::cli::Args::command();
    let mut man = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut man)?;
    std::fs::write(out.join("expressfs.1"), man)?;
    let mut warm = Vec::new();
    clap_mangen::Man::new(expressfs::warm::WarmArgs::command().name("expressfs-warm"))
        .render(&mut warm)?;
    std::fs::write(out.join("expressfs-warm.1"), warm)?;
    let mut bash = Vec::new();
    clap_complete::generate(
        clap_complete::Shell::Bash,
        &mut cmd.clone(),
        "expressfs",
        &mut bash,
    );
    std::fs::write(out.join("expressfs.bash"), bash)?;
    let mut zsh = Vec::new();
    clap_complete::generate(
        clap_complete::Shell::Zsh,
        &mut cmd.clone(),
        "expressfs",
        &mut zsh,
    );
    std::fs::write(out.join("_expressfs"), zsh)?;
    println!("wrote {}", out.display());
    Ok(())
}
