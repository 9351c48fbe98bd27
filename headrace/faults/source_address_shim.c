/* Source-address shim: an LD_PRELOAD library that binds every outgoing IPv4 TCP connection of
 * a process to the loopback address in HEADRACE_SOURCE_ADDRESS before it connects.
 *
 * Inside the fault harness's namespace every node listens on its own 127.0.0.x address, but a
 * connection it opens would leave from 127.0.0.1 (the primary address of lo), so an iptables
 * rule could not tell which node sent a packet. With this shim preloaded, node X's packets to
 * node Y all carry source X: requests on the connections X opens, answers on those Y opens
 * (they are addressed to X). Sockets already bound, non-IPv4 sockets and destinations outside
 * 127.0.0.0/8 are left alone; a failed bind leaves the connection to the kernel's choice.
 * Thread-safety: the address is parsed once (idempotent, racing callers compute the same).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>

typedef int (*connect_function)(int, const struct sockaddr *, socklen_t);

static in_addr_t source_address(void) {
    static volatile in_addr_t parsed = 0;
    if (parsed == 0) {
        const char *text = getenv("HEADRACE_SOURCE_ADDRESS");
        struct in_addr address;
        if (text != NULL && inet_pton(AF_INET, text, &address) == 1) {
            parsed = address.s_addr;
        }
    }
    return parsed;
}

static int is_loopback(const struct sockaddr *destination, socklen_t length) {
    if (destination == NULL || length < (socklen_t)sizeof(struct sockaddr_in) ||
        destination->sa_family != AF_INET) {
        return 0;
    }
    const struct sockaddr_in *inet = (const struct sockaddr_in *)destination;
    return (ntohl(inet->sin_addr.s_addr) >> 24) == 127;
}

static void bind_to_source(int descriptor) {
    in_addr_t source = source_address();
    struct sockaddr_in current;
    socklen_t current_length = sizeof current;
    if (source == 0 ||
        getsockname(descriptor, (struct sockaddr *)&current, &current_length) != 0 ||
        current.sin_family != AF_INET || current.sin_port != 0 ||
        current.sin_addr.s_addr != htonl(INADDR_ANY)) {
        return;
    }
    struct sockaddr_in local = {0};
    local.sin_family = AF_INET;
    local.sin_addr.s_addr = source;
    int defer_port = 1; /* the port is picked at connect, per destination, as without a bind */
    (void)setsockopt(descriptor, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &defer_port,
                     sizeof defer_port);
    (void)bind(descriptor, (const struct sockaddr *)&local, sizeof local);
}

int connect(int descriptor, const struct sockaddr *destination, socklen_t length) {
    static connect_function real_connect = NULL;
    if (real_connect == NULL) {
        real_connect = (connect_function)dlsym(RTLD_NEXT, "connect");
    }
    if (is_loopback(destination, length)) {
        bind_to_source(descriptor);
    }
    return real_connect(descriptor, destination, length);
}
