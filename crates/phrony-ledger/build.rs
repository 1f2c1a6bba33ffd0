//! Rebuild when a migration file is added or changed: `sqlx::migrate!` embeds them at compile
//! time but cannot tell cargo about new files on its own.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
