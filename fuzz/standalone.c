/*
 * main() for a fuzz target built without libFuzzer: replays each file named
 * on the command line, and every file of each directory named, through
 * LLVMFuzzerTestOneInput. make test uses it to build the targets with gcc and
 * replay the committed corpus, so the fuzz code compiles and runs in CI.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long n;

    if (!f) {
        perror(path);
        return -1;
    }
    if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
        perror(path);
        fclose(f);
        return -1;
    }
    buf = malloc((size_t)n + 1);    /* +1: a zero-length input still gets a valid pointer */
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        perror(path);
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int i, files = 0, failed = 0;

    for (i = 1; i < argc; i++) {
        struct stat st;
        DIR *d;
        struct dirent *e;
        char path[4096];

        if (stat(argv[i], &st)) {
            perror(argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            failed |= replay(argv[i]) != 0;
            files++;
            continue;
        }
        d = opendir(argv[i]);
        if (!d) {
            perror(argv[i]);
            return 1;
        }
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
            if (stat(path, &st) || !S_ISREG(st.st_mode))
                continue;
            failed |= replay(path) != 0;
            files++;
        }
        closedir(d);
    }
    printf("%s: %d inputs replayed\n", argv[0], files);
    return failed || files == 0;
}
