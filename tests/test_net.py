"""The emulated kernel's IPv4/TCP receive path and socket calls, end to end: packets go
into the NIC ring with Kernel.inject_packet(), sockets are driven by real system calls."""

import errno
import socket
import struct

import pytest

from kprobefs.machine import Kernel, UserBuffer
from kprobefs.machine.abi import AF_INET, O_NONBLOCK, SOCK_STREAM
from kprobefs.machine.workload import inet_checksum

SOCK_NONBLOCK = O_NONBLOCK
FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10
PEER, LOCAL = "192.0.2.7", "10.0.2.15"
# indices into the kernel's SNMP arrays (include/net.h)
IP_INHDRERRORS, IP_CSUMERRORS, IP_INDELIVERS = 3, 8, 2
TCP_PASSIVEOPENS, TCP_INSEGS, TCP_INERRS, TCP_CSUMERRORS = 1, 5, 7, 9
LINUX_LISTENOVERFLOWS = 0


def packet(sport, dport, flags, seq=1000, ack=0, payload=b"", src=PEER, dst=LOCAL,
           ip_csum=True, tcp_csum=True, version=4):
    """An IPv4 datagram holding one TCP segment, checksums computed unless told not to."""
    saddr, daddr = socket.inet_aton(src), socket.inet_aton(dst)
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0)
    tcp += payload
    if tcp_csum:
        pseudo = saddr + daddr + struct.pack("!BBH", 0, 6, len(tcp))
        tcp = tcp[:16] + struct.pack("!H", inet_checksum(pseudo + tcp)) + tcp[18:]
    else:
        tcp = tcp[:16] + b"\x12\x34" + tcp[18:]  # wrong, and not the "unchecked" 0
    ip = struct.pack("!BBHHHBBH4s4s", (version << 4) | 5, 0, 20 + len(tcp), 1, 0x4000, 64,
                     6, 0, saddr, daddr)
    check = inet_checksum(ip) if ip_csum else 0xBEEF
    return ip[:10] + struct.pack("!H", check) + ip[12:] + tcp


@pytest.fixture
def kernel():
    return Kernel(cpus=2, seed=0)


@pytest.fixture
def task(kernel):
    return kernel.spawn("server")


@pytest.fixture
def sc(kernel, task):
    return lambda name, *args: kernel.syscall(task, name, *args)


def counter(kernel, array, index):
    return struct.unpack("<Q", kernel.read(kernel.image.symbol_value(array) + 8 * index, 8))[0]


def sockaddr(port, addr="0.0.0.0"):
    return struct.pack("<H", AF_INET) + struct.pack("!H", port) + socket.inet_aton(addr) + bytes(8)


def listener(sc, port, flags=0, backlog=8):
    fd = sc("socket", AF_INET, SOCK_STREAM | flags, 0)
    assert fd >= 0, fd
    assert sc("bind", fd, sockaddr(port), 16) == 0
    assert sc("listen", fd, backlog) == 0
    return fd


def deliver(kernel, pkt):
    kernel.inject_packet(pkt)
    kernel.run_until_idle()


def test_accept_blocks_until_a_syn_arrives(kernel, task, sc):
    fd = listener(sc, 8080)
    addr, addrlen = UserBuffer(16), UserBuffer(4, struct.pack("<i", 16))
    req = kernel.submit(task, "accept4", fd, addr, addrlen, 0)
    kernel.run_until_idle()
    assert not req.done.is_set()  # asleep in inet_csk_accept
    deliver(kernel, packet(40000, 8080, SYN, seq=5000))
    newfd = kernel.wait(req)
    assert newfd > fd
    assert struct.unpack("<i", addrlen.data)[0] == 16
    family, port = struct.unpack("<H", addr.data[:2])[0], struct.unpack("!H", addr.data[2:4])[0]
    assert (family, port, socket.inet_ntoa(addr.data[4:8])) == (AF_INET, 40000, PEER)
    assert counter(kernel, "tcp_statistics", TCP_PASSIVEOPENS) == 1


def test_data_reaches_the_accepted_socket(kernel, task, sc):
    fd = listener(sc, 8081, SOCK_NONBLOCK)
    deliver(kernel, packet(40001, 8081, SYN, seq=100))
    conn = sc("accept", fd, 0, 0)
    assert conn >= 0
    deliver(kernel, packet(40001, 8081, ACK | PSH, seq=101, payload=b"GET / HTTP/1.0\r\n"))
    deliver(kernel, packet(40001, 8081, ACK | PSH, seq=101, payload=b"GET / HTTP/1.0\r\n"))
    buf = UserBuffer(64)
    assert sc("read", conn, buf, 64) == 16
    assert buf.data[:16] == b"GET / HTTP/1.0\r\n"  # the retransmission was not queued twice
    # a blocking read waits for the next segment; FIN then reads as end of file
    req = kernel.submit(task, "read", conn, buf, 64)
    kernel.run_until_idle()
    assert not req.done.is_set()
    deliver(kernel, packet(40001, 8081, ACK | PSH | FIN, seq=117, payload=b"bye"))
    assert kernel.wait(req) == 3 and buf.data[:3] == b"bye"
    assert sc("read", conn, buf, 64) == 0
    assert sc("write", conn, b"reply", 5) == 5
    assert sc("lseek", conn, 0, 0) == -errno.ESPIPE
    assert sc("close", conn) == 0


def test_nonblocking_accept_returns_eagain(kernel, task, sc):
    fd = listener(sc, 8082, SOCK_NONBLOCK)
    assert sc("accept4", fd, 0, 0, 0) == -errno.EAGAIN
    # accept4's SOCK_NONBLOCK is for the new socket: a blocking listener still waits
    blocking = listener(sc, 8083)
    req = kernel.submit(task, "accept4", blocking, 0, 0, SOCK_NONBLOCK)
    kernel.run_until_idle()
    assert not req.done.is_set()
    deliver(kernel, packet(40010, 8083, SYN))
    conn = kernel.wait(req)
    assert conn >= 0
    assert sc("read", conn, UserBuffer(8), 8) == -errno.EAGAIN


def test_bad_checksums_are_dropped(kernel, sc):
    fd = listener(sc, 8084, SOCK_NONBLOCK)
    deliver(kernel, packet(40002, 8084, SYN, ip_csum=False))
    assert counter(kernel, "ip_statistics", IP_CSUMERRORS) == 1
    assert counter(kernel, "ip_statistics", IP_INHDRERRORS) == 1
    deliver(kernel, packet(40002, 8084, SYN, tcp_csum=False))
    assert counter(kernel, "tcp_statistics", TCP_CSUMERRORS) == 1
    assert counter(kernel, "tcp_statistics", TCP_INERRS) == 1
    deliver(kernel, packet(40002, 8084, SYN, version=6))
    assert counter(kernel, "ip_statistics", IP_INHDRERRORS) == 2
    deliver(kernel, packet(40002, 8084, SYN)[:30])  # truncated
    assert sc("accept", fd, 0, 0) == -errno.EAGAIN  # nothing got through
    deliver(kernel, packet(40002, 8084, SYN))
    assert sc("accept", fd, 0, 0) >= 0


def test_syn_to_a_closed_port_and_backlog_overflow(kernel, sc):
    deliver(kernel, packet(40003, 9999, SYN))
    assert counter(kernel, "tcp_statistics", TCP_INSEGS) == 1
    assert counter(kernel, "tcp_statistics", TCP_PASSIVEOPENS) == 0
    fd = listener(sc, 8085, SOCK_NONBLOCK, backlog=0)  # room for one, as on Linux
    for port in (41000, 41001, 41002):
        deliver(kernel, packet(port, 8085, SYN))
    assert counter(kernel, "net_statistics", LINUX_LISTENOVERFLOWS) == 2
    assert sc("accept", fd, 0, 0) >= 0
    assert sc("accept", fd, 0, 0) == -errno.EAGAIN


def test_socket_call_errors(kernel, sc):
    assert sc("socket", 10, SOCK_STREAM, 0) == -errno.EAFNOSUPPORT
    assert sc("socket", AF_INET, SOCK_STREAM, 17) == -errno.EPROTONOSUPPORT
    assert sc("socket", AF_INET, SOCK_STREAM | 0x100000, 0) == -errno.EINVAL
    fd = sc("socket", AF_INET, SOCK_STREAM, 0)
    assert sc("bind", fd, 0xDEAD0000, 16) == -errno.EFAULT
    assert sc("bind", fd, sockaddr(7000), 8) == -errno.EINVAL
    assert sc("bind", fd, sockaddr(7000), 16) == 0
    assert sc("bind", fd, sockaddr(7001), 16) == -errno.EINVAL  # bound already
    other = sc("socket", AF_INET, SOCK_STREAM, 0)
    assert sc("bind", other, sockaddr(7000), 16) == -errno.EADDRINUSE
    assert sc("accept", fd, 0, 0) == -errno.EINVAL  # not listening
    assert sc("listen", 99, 1) == -errno.EBADF
    null = sc("open", "/dev/null", 0, 0)
    assert sc("listen", null, 1) == -errno.ENOTSOCK
    assert sc("close", fd) == 0
    assert sc("bind", other, sockaddr(7000), 16) == 0  # the port is free again


def test_closing_a_listener_frees_queued_connections(kernel, sc):
    fd = listener(sc, 8086, SOCK_NONBLOCK)
    deliver(kernel, packet(42000, 8086, SYN))
    deliver(kernel, packet(42001, 8086, SYN))
    socks = counter(kernel, "nr_socks", 0)
    assert socks == 3
    assert sc("close", fd) == 0
    assert counter(kernel, "nr_socks", 0) == 0
    deliver(kernel, packet(42002, 8086, SYN))  # nobody listens any more
    assert counter(kernel, "nr_socks", 0) == 0
