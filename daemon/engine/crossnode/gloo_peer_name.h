// A guard around one check in Debian's Gloo (snapshot 2022-05-18) that could
// end the whole daemon from the network.
//
// Gloo's TCP pair accepts its peer's connection on Gloo's own IO thread and
// then asks for the peer's address; when the connection was reset between
// the TCP handshake and the accept (a daemon tearing down a failed
// rendezvous, or anyone who can reach cluster.data_address), getpeername
// fails with ENOTCONN, Gloo throws in that thread, nothing can catch it, and
// the process terminates. gloo_peer_name.cc defines
// gloo::transport::tcp::Address::fromPeerName in our binary: libgloo calls
// it through its PLT, so the dynamic linker binds libgloo's call to this
// definition (ELF interposition). It answers an empty address instead of
// throwing; the pair then reads the reset and fails like any broken
// connection, which the link reports as a Status.
//
// Interposition holds only when the definition is in the executable (or a
// library loaded before libgloo) and libgloo is not linked -Bsymbolic;
// GlooPeerNameGuardActive() checks the binding actually made, and the
// transport logs an error at its first use when it is not.
#ifndef HSDP_DAEMON_ENGINE_CROSSNODE_GLOO_PEER_NAME_H_
#define HSDP_DAEMON_ENGINE_CROSSNODE_GLOO_PEER_NAME_H_

namespace hsdp {

// Whether the process resolves Gloo's fromPeerName to the guard.
bool GlooPeerNameGuardActive();

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_CROSSNODE_GLOO_PEER_NAME_H_
