//! Which process holds a TCP connection, read from Linux's `/proc`: the model check kills the
//! worker process that is sending a tool request at that moment, whichever of them it is.

use std::net::SocketAddr;

/// The one of `pids` whose socket has the local address `local` (the other end of a
/// connection the test's server accepted from `local`), if any.
pub fn owner_of(local: SocketAddr, pids: &[u32]) -> Option<u32> {
    let inode = socket_inode(local)?;
    let target = format!("socket:[{inode}]");
    pids.iter().copied().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|link| link.to_string_lossy() == target)
            })
    })
}

/// The inode of the IPv4 TCP socket bound to `local`, from `/proc/net/tcp`.
fn socket_inode(local: SocketAddr) -> Option<u64> {
    let SocketAddr::V4(v4) = local else {
        return None;
    };
    // The kernel writes the address as the 32-bit number in host order, then the port.
    let wanted = format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(v4.ip().octets()),
        v4.port()
    );
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&wanted.as_str())).then(|| fields.get(9)?.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_found_in_this_process() {
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(server.local_addr().unwrap()).unwrap();
        let (_accepted, peer) = server.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        let me = std::process::id();
        assert_eq!(owner_of(peer, &[1_000_000_000, me]), Some(me));
        let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let nobody = unused.local_addr().unwrap();
        drop(unused);
        assert_eq!(owner_of(nobody, &[me]), None);
    }
}
