/* LD_PRELOAD shim for power-cut simulation (see headrace/faults/power_cut.py, which builds it).
 *
 * It interposes fsync and fdatasync. After the real call succeeds on a descriptor whose path
 * lies under $POWER_CUT_DATA_DIR, it records what that call made durable in
 * $POWER_CUT_SHADOW_DIR:
 *   - a regular file: its whole content, copied to files/<inode> (written to a temporary name
 *     and renamed, so a SIGKILL during the copy leaves the previous record);
 *   - a directory: its entries, one line "<f|d> <inode> <name>" each, in dirs/<inode>.
 * Content is read back after the sync, so writes that bypass every wrapper (the compiled
 * kernel's write(2) on the production append path) are covered exactly like others.
 * Records are made under one mutex, so the last record of a file is the latest state.
 *
 * $POWER_CUT_DROP_FSYNC_SUFFIX (mutation runs only): an fsync or fdatasync of a file whose
 * name ends with it does nothing and records nothing, as if the call were removed.
 *
 * Thread-safety: records are serialised by a process-wide mutex. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define COPY_CHUNK_BYTES (1 << 20)

static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static const char *data_dir;
static size_t data_dir_length;
static const char *shadow_dir;
static const char *drop_suffix;
static pthread_mutex_t record_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void power_cut_init(void)
{
    real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    data_dir = getenv("POWER_CUT_DATA_DIR");
    shadow_dir = getenv("POWER_CUT_SHADOW_DIR");
    drop_suffix = getenv("POWER_CUT_DROP_FSYNC_SUFFIX");
    if (drop_suffix != NULL && drop_suffix[0] == '\0')
        drop_suffix = NULL;
    data_dir_length = data_dir ? strlen(data_dir) : 0;
}

/* The descriptor's path if it lies under the data directory (or is it), else 0. */
static int path_under_data_dir(int fd, char *path, size_t path_size)
{
    char link[64];
    if (data_dir == NULL || shadow_dir == NULL)
        return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t length = readlink(link, path, path_size - 1);
    if (length <= 0)
        return 0;
    path[length] = '\0';
    if (strncmp(path, data_dir, data_dir_length) != 0)
        return 0;
    return path[data_dir_length] == '\0' || path[data_dir_length] == '/';
}

static int ends_with(const char *text, const char *suffix)
{
    size_t text_length = strlen(text), suffix_length = strlen(suffix);
    return text_length >= suffix_length
        && strcmp(text + text_length - suffix_length, suffix) == 0;
}

static void publish(const char *tmp_path, const char *kind, unsigned long inode)
{
    char final_path[PATH_MAX];
    snprintf(final_path, sizeof final_path, "%s/%s/%lu", shadow_dir, kind, inode);
    rename(tmp_path, final_path);
}

/* The descriptor's file opened again for reading (the descriptor itself may be write-only). */
static int reopen_for_reading(int fd)
{
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    return open(link, O_RDONLY);
}

static void record_file(int fd, unsigned long inode)
{
    char tmp_path[PATH_MAX];
    snprintf(tmp_path, sizeof tmp_path, "%s/files/%lu.tmp", shadow_dir, inode);
    int out = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int source = reopen_for_reading(fd);
    char *buffer = malloc(COPY_CHUNK_BYTES);
    if (out < 0 || source < 0 || buffer == NULL)
        abort();
    off_t position = 0;
    for (;;) {
        ssize_t count = pread(source, buffer, COPY_CHUNK_BYTES, position);
        if (count < 0)
            abort();
        if (count == 0)
            break;
        if (write(out, buffer, (size_t)count) != count)
            abort();
        position += count;
    }
    free(buffer);
    close(source);
    close(out);
    publish(tmp_path, "files", inode);
}

static void record_directory(int fd, unsigned long inode)
{
    char tmp_path[PATH_MAX];
    snprintf(tmp_path, sizeof tmp_path, "%s/dirs/%lu.tmp", shadow_dir, inode);
    FILE *out = fopen(tmp_path, "w");
    int listing_fd = reopen_for_reading(fd);
    DIR *listing = listing_fd >= 0 ? fdopendir(listing_fd) : NULL;
    if (out == NULL || listing == NULL)
        abort();
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0)
            continue;
        struct stat status;
        if (fstatat(fd, entry->d_name, &status, AT_SYMLINK_NOFOLLOW) != 0)
            continue; /* removed while listing: the entry was not durable */
        if (S_ISREG(status.st_mode) || S_ISDIR(status.st_mode))
            fprintf(out, "%c %lu %s\n", S_ISDIR(status.st_mode) ? 'd' : 'f',
                    (unsigned long)status.st_ino, entry->d_name);
    }
    closedir(listing);
    fclose(out);
    publish(tmp_path, "dirs", inode);
}

static void record_durable_state(int fd)
{
    struct stat status;
    if (fstat(fd, &status) != 0)
        return;
    pthread_mutex_lock(&record_lock);
    if (S_ISDIR(status.st_mode))
        record_directory(fd, (unsigned long)status.st_ino);
    else if (S_ISREG(status.st_mode))
        record_file(fd, (unsigned long)status.st_ino);
    pthread_mutex_unlock(&record_lock);
}

static int synced(int fd, int (*real_call)(int))
{
    char path[PATH_MAX];
    if (!path_under_data_dir(fd, path, sizeof path))
        return real_call(fd);
    if (drop_suffix != NULL && ends_with(path, drop_suffix))
        return 0;
    int result = real_call(fd);
    if (result == 0)
        record_durable_state(fd);
    return result;
}

int fsync(int fd)
{
    return synced(fd, real_fsync);
}

int fdatasync(int fd)
{
    return synced(fd, real_fdatasync);
}
