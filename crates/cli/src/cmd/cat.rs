//! `ext4kit cat IMAGE PATH`.

use super::Image;
use std::io::Write;

use ext4kit::OpenFlags;

/// Stream a file to standard output.
pub fn run(image: &Image, path: &str, budget: usize) -> Result<(), String> {
    let fs = super::open(image, budget)?;
    let f = fs
        .open(path.as_bytes(), OpenFlags::default())
        .map_err(|e| super::err(image, path, e))?;
    if f.is_dir() {
        return Err(format!("{}: {path}: is a directory", image.display()));
    }
    let out = std::io::stdout();
    let mut out = out.lock();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = fs.read(&f, &mut buf).map_err(|e| super::err(image, path, e))?;
        if n == 0 {
            break;
        }
        if out.write_all(&buf[..n]).is_err() {
            return Ok(()); // reader went away
        }
    }
    out.flush().ok();
    Ok(())
}
