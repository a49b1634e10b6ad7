/* Reads NVML the way nvidia-smi, pynvml and nvitop do, and prints what it saw, one fact per line, for
 * tests/hook/test_nvml.py. Built twice: nvmltest dlopens libnvidia-ml.so.1 and looks every function up
 * with dlsym (pynvml's way); nvmltest_linked is linked to the library (a C program's way).
 * Argument: "hold" sleeps after printing until stdin closes, so a test can list this process.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void *dev_t_;
struct mem_v1 { unsigned long long total, free, used; };
struct mem_v2 { unsigned version; unsigned long long total, reserved, free, used; };
struct proc_v1 { unsigned pid; unsigned long long used; };
struct proc_v2 { unsigned pid; unsigned long long used; unsigned gi, ci; };
struct detail { unsigned pid; unsigned long long used; unsigned gi, ci; unsigned long long cc; };
struct detail_list { unsigned version, mode, count; struct detail *procs; };

#ifdef LINKED
int nvmlInit_v2(void);
int nvmlDeviceGetCount_v2(unsigned *);
int nvmlDeviceGetHandleByIndex_v2(unsigned, dev_t_ *);
int nvmlDeviceGetUUID(dev_t_, char *, unsigned);
int nvmlDeviceGetIndex(dev_t_, unsigned *);
int nvmlDeviceGetName(dev_t_, char *, unsigned);
int nvmlDeviceGetMemoryInfo(dev_t_, struct mem_v1 *);
int nvmlDeviceGetMemoryInfo_v2(dev_t_, struct mem_v2 *);
int nvmlDeviceGetComputeRunningProcesses(dev_t_, unsigned *, struct proc_v1 *);
int nvmlDeviceGetComputeRunningProcesses_v3(dev_t_, unsigned *, struct proc_v2 *);
int nvmlDeviceGetRunningProcessDetailList(dev_t_, struct detail_list *);
int nvmlSystemGetProcessName(unsigned, char *, unsigned);
#define F(name) name
#define LOAD() 0
#else
static void *lib;
#define F(name) ((__typeof__(&name##_t))look(#name))
static void *look(const char *name)
{
    void *f = dlsym(lib, name);
    if (!f) { fprintf(stderr, "nvmltest: no %s\n", name); exit(3); }
    return f;
}
int nvmlInit_v2_t(void);
int nvmlDeviceGetCount_v2_t(unsigned *);
int nvmlDeviceGetHandleByIndex_v2_t(unsigned, dev_t_ *);
int nvmlDeviceGetUUID_t(dev_t_, char *, unsigned);
int nvmlDeviceGetIndex_t(dev_t_, unsigned *);
int nvmlDeviceGetName_t(dev_t_, char *, unsigned);
int nvmlDeviceGetMemoryInfo_t(dev_t_, struct mem_v1 *);
int nvmlDeviceGetMemoryInfo_v2_t(dev_t_, struct mem_v2 *);
int nvmlDeviceGetComputeRunningProcesses_t(dev_t_, unsigned *, struct proc_v1 *);
int nvmlDeviceGetComputeRunningProcesses_v3_t(dev_t_, unsigned *, struct proc_v2 *);
int nvmlDeviceGetRunningProcessDetailList_t(dev_t_, struct detail_list *);
int nvmlSystemGetProcessName_t(unsigned, char *, unsigned);
#define LOAD() ((lib = dlopen("libnvidia-ml.so.1", RTLD_NOW)) == NULL)
#endif

int main(int argc, char **argv)
{
    if (LOAD()) { fprintf(stderr, "nvmltest: %s\n", dlerror()); return 2; }
    if (F(nvmlInit_v2)() != 0) { fprintf(stderr, "nvmltest: nvmlInit failed\n"); return 2; }
    printf("pid %d\n", (int)getpid());
    unsigned n = 0;
    int count_rc = F(nvmlDeviceGetCount_v2)(&n);
    printf("count rc %d n %u\n", count_rc, n);
    for (unsigned i = 0; i < n + 1; i++) {
        dev_t_ d = NULL;
        int rc = F(nvmlDeviceGetHandleByIndex_v2)(i, &d);
        if (rc != 0) { printf("handle %u rc %d\n", i, rc); continue; }
        char uuid[96] = "", name[64] = "";
        unsigned idx = 99;
        F(nvmlDeviceGetUUID)(d, uuid, sizeof uuid);
        F(nvmlDeviceGetIndex)(d, &idx);
        F(nvmlDeviceGetName)(d, name, sizeof name);
        printf("dev %u uuid %s index %u name %s\n", i, uuid, idx, name);
        struct mem_v1 m;
        rc = F(nvmlDeviceGetMemoryInfo)(d, &m);
        printf("mem %u rc %d total %llu free %llu used %llu\n", i, rc, m.total, m.free, m.used);
        struct mem_v2 m2 = {.version = (unsigned)(sizeof m2 | (2u << 24))};
        rc = F(nvmlDeviceGetMemoryInfo_v2)(d, &m2);
        printf("mem2 %u rc %d total %llu reserved %llu free %llu used %llu\n", i, rc, m2.total,
               m2.reserved, m2.free, m2.used);
        unsigned c = 0;
        rc = F(nvmlDeviceGetComputeRunningProcesses_v3)(d, &c, NULL);
        printf("probe %u rc %d count %u\n", i, rc, c);
        struct proc_v2 p[32];
        c = 32;
        rc = F(nvmlDeviceGetComputeRunningProcesses_v3)(d, &c, p);
        for (unsigned k = 0; rc == 0 && k < c; k++)
            printf("proc %u pid %u used %llu\n", i, p[k].pid, p[k].used);
        struct proc_v1 p1[32];
        c = 32;
        rc = F(nvmlDeviceGetComputeRunningProcesses)(d, &c, p1);
        for (unsigned k = 0; rc == 0 && k < c; k++)
            printf("proc1 %u pid %u used %llu\n", i, p1[k].pid, p1[k].used);
        struct detail dl[32];
        struct detail_list l = {.version = (unsigned)(sizeof l | (1u << 24)), .mode = 0, .count = 32, .procs = dl};
        rc = F(nvmlDeviceGetRunningProcessDetailList)(d, &l);
        for (unsigned k = 0; rc == 0 && k < l.count; k++)
            printf("detail %u pid %u used %llu\n", i, dl[k].pid, dl[k].used);
    }
    /* NVMLTEST_NAMES="pid,pid": each pid's name as nvidia-smi asks for it. */
    const char *names = getenv("NVMLTEST_NAMES");
    for (const char *p = names; p && *p;) {
        unsigned pid = (unsigned)strtoul(p, NULL, 10);
        char pname[64] = "";
        int rc = F(nvmlSystemGetProcessName)(pid, pname, sizeof pname);
        printf("pname %u rc %d name %s\n", pid, rc, rc == 0 ? pname : "-");
        p = strchr(p, ',');
        if (p)
            p++;
    }
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "hold") == 0) {
        char buf[8];
        while (read(0, buf, sizeof buf) > 0) {}
    }
    return 0;
}
