/*
 * aiwg-guest: the agent channel's helper inside the tiny VM guest (scripts/build-guest-image.py).
 *
 * The guest has no Python, so this is a small static C program with two modes:
 *
 *   aiwg-guest daemon PORT
 *     Started by /init. Owns the virtio-serial port PORT (named org.aiwg.agent.0; hostd holds its
 *     other end) and listens on the Unix socket /run/aiwg-mux.sock. Each connection there is one
 *     exec's control channel: its first line is the exec id; every later line is the agent's own.
 *     On the port, one line per message, the exec id first:
 *       guest -> host   "O <id>"            a channel opened
 *                       "D <id> <line>"     a line the agent wrote
 *                       "E <id>"            the agent closed its end
 *       host -> guest   "D <id> <line>"     a line for the agent
 *                       "C <id>"            hostd closed the channel
 *     Lines are JSON objects without newlines (the protocol's lines), so no escaping is needed.
 *     Writes to agents are buffered per channel (never blocking the others); an agent whose buffer
 *     passes MAX_PENDING is cut off. A line longer than MAX_LINE is dropped.
 *
 *   aiwg-guest exec ID -- ARGV...
 *     What hostd's guest-exec runs for an exec with a control channel: connects to the daemon,
 *     says ID, makes that connection fd 3 (AIWG_CONTROL_FD=3) and execs ARGV. Without the daemon
 *     it execs ARGV with no channel (AIWG_CONTROL_FD unset), as a VM without the helper would.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MUX_PATH "/run/aiwg-mux.sock"
#define MAX_CHANNELS 64
#define MAX_ID 64
#define MAX_LINE (4 * 1024 * 1024 + 128)
#define MAX_PENDING (16 * 1024 * 1024)
#define CHUNK 65536

struct buf {
    char *data;
    size_t len, cap;
};

static int buf_add(struct buf *b, const char *data, size_t len) {
    if (b->len + len > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + len) cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown) return -1;
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    return 0;
}

static void buf_drop(struct buf *b, size_t n) {
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

static void buf_free(struct buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

struct channel {
    int fd;            /* -1: free slot */
    int named;         /* its first line (the id) has arrived */
    int skipping;      /* inside a line longer than MAX_LINE */
    char id[MAX_ID + 1];
    struct buf in, out;
};

static struct channel channels[MAX_CHANNELS];
static int port = -1;
static struct buf port_in, port_out;
static int port_skipping;

static void port_send(const char *kind, const char *id, const char *line, size_t len) {
    buf_add(&port_out, kind, strlen(kind));
    buf_add(&port_out, " ", 1);
    buf_add(&port_out, id, strlen(id));
    if (line) {
        buf_add(&port_out, " ", 1);
        buf_add(&port_out, line, len);
    }
    buf_add(&port_out, "\n", 1);
}

static void channel_close(struct channel *c, int tell_host) {
    if (c->fd < 0) return;
    if (tell_host && c->named) port_send("E", c->id, NULL, 0);
    close(c->fd);
    c->fd = -1;
    buf_free(&c->in);
    buf_free(&c->out);
}

static struct channel *find(const char *id, size_t len) {
    for (int i = 0; i < MAX_CHANNELS; i++)
        if (channels[i].fd >= 0 && channels[i].named && strlen(channels[i].id) == len &&
            memcmp(channels[i].id, id, len) == 0)
            return &channels[i];
    return NULL;
}

/* One whole line the agent (or, first, its launcher) wrote. */
static void channel_line(struct channel *c, char *line, size_t len) {
    if (!c->named) {
        if (len == 0 || len > MAX_ID || memchr(line, ' ', len)) {
            channel_close(c, 0);
            return;
        }
        memcpy(c->id, line, len);
        c->id[len] = 0;
        c->named = 1;
        port_send("O", c->id, NULL, 0);
        return;
    }
    if (len) port_send("D", c->id, line, len);
}

static void channel_read(struct channel *c) {
    char chunk[CHUNK];
    ssize_t n = read(c->fd, chunk, sizeof chunk);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        channel_close(c, 1);
        return;
    }
    buf_add(&c->in, chunk, (size_t)n);
    char *nl;
    while (c->fd >= 0 && (nl = memchr(c->in.data, '\n', c->in.len))) {
        size_t len = (size_t)(nl - c->in.data);
        if (!c->skipping) channel_line(c, c->in.data, len);
        c->skipping = 0;
        if (c->fd >= 0) buf_drop(&c->in, len + 1);
    }
    if (c->fd >= 0 && c->in.len > MAX_LINE) { /* dropped: the host refuses it anyway */
        c->skipping = 1;
        c->in.len = 0;
    }
}

/* One whole line from the host. */
static void port_line(char *line, size_t len) {
    if (len < 3 || line[1] != ' ') return;
    char *id = line + 2, *end = line + len;
    char *space = memchr(id, ' ', (size_t)(end - id));
    size_t idlen = (size_t)((space ? space : end) - id);
    struct channel *c = find(id, idlen);
    if (!c) return;
    if (line[0] == 'C') {
        channel_close(c, 0);
    } else if (line[0] == 'D' && space) {
        if (c->out.len > MAX_PENDING) { /* an agent that never reads is cut off */
            channel_close(c, 1);
            return;
        }
        buf_add(&c->out, space + 1, (size_t)(end - space - 1));
        buf_add(&c->out, "\n", 1);
    }
}

static void port_read(void) {
    char chunk[CHUNK];
    ssize_t n = read(port, chunk, sizeof chunk);
    if (n <= 0) return; /* nobody on the host side yet (or EAGAIN): poll tells us when */
    buf_add(&port_in, chunk, (size_t)n);
    char *nl;
    while ((nl = memchr(port_in.data, '\n', port_in.len))) {
        size_t len = (size_t)(nl - port_in.data);
        if (!port_skipping) port_line(port_in.data, len);
        port_skipping = 0;
        buf_drop(&port_in, len + 1);
    }
    if (port_in.len > MAX_LINE) {
        port_skipping = 1;
        port_in.len = 0;
    }
}

static void flush(int fd, struct buf *b) {
    while (b->len) {
        ssize_t n = write(fd, b->data, b->len);
        if (n <= 0) return; /* EAGAIN: the rest when poll says so */
        buf_drop(b, (size_t)n);
    }
}

static int listen_mux(void) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strncpy(addr.sun_path, MUX_PATH, sizeof addr.sun_path - 1);
    unlink(MUX_PATH);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 16) < 0) {
        perror("aiwg-guest: " MUX_PATH);
        exit(1);
    }
    chmod(MUX_PATH, 0666);
    return fd;
}

static int daemon_main(const char *port_path) {
    signal(SIGPIPE, SIG_IGN);
    for (int i = 0; i < MAX_CHANNELS; i++) channels[i].fd = -1;
    port = open(port_path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (port < 0) {
        perror(port_path);
        return 1;
    }
    int mux = listen_mux();
    for (;;) {
        struct pollfd fds[MAX_CHANNELS + 2];
        int map[MAX_CHANNELS + 2], n = 0;
        fds[n] = (struct pollfd){.fd = mux, .events = POLLIN};
        map[n++] = -1;
        fds[n] = (struct pollfd){.fd = port, .events = POLLIN | (port_out.len ? POLLOUT : 0)};
        map[n++] = -2;
        for (int i = 0; i < MAX_CHANNELS; i++) {
            if (channels[i].fd < 0) continue;
            fds[n] = (struct pollfd){.fd = channels[i].fd, .events = POLLIN | (channels[i].out.len ? POLLOUT : 0)};
            map[n++] = i;
        }
        if (poll(fds, (nfds_t)n, 1000) < 0) {
            if (errno == EINTR) continue;
            perror("aiwg-guest: poll");
            return 1;
        }
        for (int k = 0; k < n; k++) {
            short ev = fds[k].revents;
            if (!ev) continue;
            if (map[k] == -1) {
                int fd = accept4(mux, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                int slot = -1;
                for (int i = 0; i < MAX_CHANNELS && fd >= 0; i++)
                    if (channels[i].fd < 0) {
                        slot = i;
                        break;
                    }
                if (fd >= 0 && slot < 0) close(fd); /* full: that agent runs without a channel */
                if (slot >= 0) channels[slot] = (struct channel){.fd = fd};
            } else if (map[k] == -2) {
                if (ev & POLLIN) port_read();
                if (ev & POLLOUT) flush(port, &port_out);
                if ((ev & POLLHUP) && !(ev & POLLIN)) {
                    /* The host side is not connected: wait for it without spinning. */
                    struct timespec pause = {0, 100 * 1000 * 1000};
                    nanosleep(&pause, NULL);
                }
            } else {
                struct channel *c = &channels[map[k]];
                if (ev & POLLOUT) flush(c->fd, &c->out);
                if (ev & (POLLIN | POLLHUP | POLLERR)) channel_read(c);
            }
        }
        if (port_out.len) flush(port, &port_out);
    }
}

static int exec_main(const char *id, char **argv) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strncpy(addr.sun_path, MUX_PATH, sizeof addr.sun_path - 1);
    unsetenv("AIWG_CONTROL_FD");
    if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0 && dprintf(fd, "%s\n", id) > 0 &&
        dup2(fd, 3) == 3) {
        setenv("AIWG_CONTROL_FD", "3", 1);
    }
    if (fd >= 0 && fd != 3) close(fd);
    execvp(argv[0], argv);
    fprintf(stderr, "aiwg-guest: cannot run %s: %s\n", argv[0], strerror(errno));
    return 127;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "daemon") == 0) return daemon_main(argv[2]);
    if (argc >= 5 && strcmp(argv[1], "exec") == 0 && strcmp(argv[3], "--") == 0 && strlen(argv[2]) <= MAX_ID)
        return exec_main(argv[2], argv + 4);
    fprintf(stderr, "usage: aiwg-guest daemon PORT | aiwg-guest exec ID -- ARGV...\n");
    return 2;
}
