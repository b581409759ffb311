/* The Windows side of the shm interface: named file mappings.
 *
 * No directory (dir NULL or "") means the paging file: a segment is the section object
 * "Local\<segname>" and lives while some process holds a handle on it (strata-arena does while it
 * serves). A directory (--shm-dir) means a file there, mapped: such a segment outlives its
 * processes as a tmpfs file does. Every object is created with a security descriptor that grants
 * its owner alone (the equivalent of 0600), and every open checks that the object's owner is this
 * user (as own_open does on POSIX: another local user may create any name first). The calls
 * mirror shm_posix.c one for one; docs/windows.md tells how each maps.
 */
#include "common/arena/shm.h"
#include "common/base/err.h"

#include <aclapi.h>
#include <sddl.h>
#include <stdio.h>
#include <string.h>
#include <windows.h>

#define LINK_MAGIC "strata-shm-link1" /* 16 bytes, then the size and the target's name */

struct link_record {
    char magic[16];
    uint64_t size;
    char target[256];
};

/* win_err turns GetLastError() into our codes, with the system's own words in the detail. */
static int win_err(DWORD e, const char *what, const char *name)
{
    char msg[256] = "";
    FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, NULL, e, 0, msg,
                   sizeof msg, NULL);
    msg[strcspn(msg, "\r\n")] = '\0';
    int code;
    switch (e) {
    case ERROR_ALREADY_EXISTS:
    case ERROR_FILE_EXISTS:
        code = STRATA_EEXIST;
        break;
    case ERROR_FILE_NOT_FOUND:
    case ERROR_PATH_NOT_FOUND:
        code = STRATA_ENOENT;
        break;
    case ERROR_ACCESS_DENIED:
    case ERROR_PRIVILEGE_NOT_HELD:
        code = STRATA_EPERM;
        break;
    case ERROR_NOT_ENOUGH_MEMORY:
    case ERROR_OUTOFMEMORY:
    case ERROR_COMMITMENT_LIMIT:
    case ERROR_DISK_FULL:
    case ERROR_HANDLE_DISK_FULL:
        code = STRATA_ENOSPC;
        break;
    case ERROR_LOCK_VIOLATION:
    case ERROR_SHARING_VIOLATION:
        code = STRATA_EBUSY;
        break;
    case ERROR_INVALID_PARAMETER:
    case ERROR_INVALID_NAME:
        code = STRATA_EINVAL;
        break;
    default:
        code = STRATA_EIO;
    }
    return strata_errf(code, "%s %s: %s (Windows error %lu)", what, name, msg[0] ? msg : "?",
                       (unsigned long)e);
}

static bool in_paging_file(const char *dir)
{
    return !dir || !*dir;
}

/* utf16 converts a UTF-8 string; STRATA_EOVERFLOW when it does not fit n wide characters. */
static int utf16(const char *s, wchar_t *w, int n)
{
    if (MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, s, -1, w, n) == 0)
        return strata_errf(STRATA_EOVERFLOW, "name or path '%s' too long or not UTF-8", s);
    return 0;
}

/* object_name is "Local\<segname>" (a section in this session's namespace) and file_path
 * "<dir>\<segname>", as wide strings. */
static int object_name(const char *segname, const char *suffix, wchar_t *w, int n)
{
    char buf[512];
    int k = snprintf(buf, sizeof buf, "Local\\%s%s", segname, suffix);
    if (k < 0 || (size_t)k >= sizeof buf)
        return strata_errf(STRATA_EOVERFLOW, "segment name %s too long", segname);
    return utf16(buf, w, n);
}

static int file_path(const char *dir, const char *segname, wchar_t *w, int n)
{
    char buf[4096];
    int rv = shm_path(buf, sizeof buf, dir, segname);
    return rv ? rv : utf16(buf, w, n);
}

/* user_sid returns this process's user SID (a copy the caller frees with LocalFree). */
static PSID user_sid(void)
{
    HANDLE tok;
    if (!OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &tok)) return NULL;
    union {
        TOKEN_USER tu;
        char buf[256];
    } u;
    DWORD len = 0;
    PSID out = NULL;
    if (GetTokenInformation(tok, TokenUser, &u, sizeof u, &len)) {
        DWORD n = GetLengthSid(u.tu.User.Sid);
        out = LocalAlloc(LMEM_FIXED, n);
        if (out && !CopySid(n, out, u.tu.User.Sid)) {
            LocalFree(out);
            out = NULL;
        }
    }
    CloseHandle(tok);
    return out;
}

unsigned shm_uid(void)
{
    PSID sid = user_sid();
    if (!sid) return 0;
    UCHAR n = *GetSidSubAuthorityCount(sid);
    unsigned rid = n ? (unsigned)*GetSidSubAuthority(sid, n - 1u) : 0;
    LocalFree(sid);
    return rid;
}

/* owner_only makes a security descriptor that grants this user alone (named by SID: Wine, like
 * older Windows, does not know the OWNER RIGHTS alias) all access or read access. */
static int owner_only(bool writable, SECURITY_ATTRIBUTES *sa)
{
    PSID me = user_sid();
    char *sid = NULL;
    if (!me || !ConvertSidToStringSidA(me, &sid)) {
        LocalFree(me);
        return win_err(GetLastError(), "read the SID of", "this user");
    }
    char sddl[256];
    /* the owner named too: by default a new object belongs to the token's default owner, which
     * for an administrator is the Administrators group, not the user */
    snprintf(sddl, sizeof sddl, "O:%sD:P(A;;%s;;;%s)", sid, writable ? "GA" : "GR", sid);
    LocalFree(sid);
    LocalFree(me);
    PSECURITY_DESCRIPTOR sd = NULL;
    if (!ConvertStringSecurityDescriptorToSecurityDescriptorA(sddl, SDDL_REVISION_1, &sd, NULL))
        return win_err(GetLastError(), "make the security descriptor for", "a segment");
    *sa = (SECURITY_ATTRIBUTES){.nLength = sizeof *sa, .lpSecurityDescriptor = sd};
    return 0;
}

/* check_owner refuses an object that another user owns: the equivalent of own_open's check. */
static int check_owner(HANDLE h, SE_OBJECT_TYPE type, const char *name)
{
    PSID owner = NULL;
    PSECURITY_DESCRIPTOR sd = NULL;
    DWORD e = GetSecurityInfo(h, type, OWNER_SECURITY_INFORMATION, &owner, NULL, NULL, NULL, &sd);
    if (e != ERROR_SUCCESS) return win_err(e, "read the owner of", name);
    PSID me = user_sid();
    bool ours = me && owner && EqualSid(owner, me);
    char *who = NULL;
    if (!ours && owner) ConvertSidToStringSidA(owner, &who);
    int rv = ours ? 0
                  : strata_errf(STRATA_EPERM,
                                "segment %s belongs to %s, not to this user: another user made "
                                "this name first; stop their process or pick another --name",
                                name, who ? who : "another user");
    if (who) LocalFree(who);
    LocalFree(me);
    LocalFree(sd);
    return rv;
}

int shm_free_bytes(const char *dir, uint64_t *out)
{
    if (in_paging_file(dir)) {
        MEMORYSTATUSEX ms = {.dwLength = sizeof ms};
        if (!GlobalMemoryStatusEx(&ms)) return win_err(GetLastError(), "query", "memory");
        /* what can still be committed: RAM plus paging file not yet promised */
        *out = ms.ullAvailPageFile;
        return 0;
    }
    wchar_t w[4096];
    int rv;
    if ((rv = utf16(dir, w, 4096)) != 0) return rv;
    ULARGE_INTEGER avail;
    if (!GetDiskFreeSpaceExW(w, &avail, NULL, NULL))
        return win_err(GetLastError(), "query the free space of", dir);
    *out = avail.QuadPart;
    return 0;
}

static int no_space(const char *dir, uint64_t size, uint64_t allocated)
{
    uint64_t avail = 0;
    char need[SHM_SIZE_STR], have[SHM_SIZE_STR], done[SHM_SIZE_STR];
    shm_free_bytes(dir, &avail);
    const char *where = in_paging_file(dir) ? "memory and the paging file" : dir;
    const char *todo = in_paging_file(dir) ? "close programs, enlarge the paging file or pass "
                                             "--shm-dir"
                                           : "free space there or pass another --shm-dir";
    if (allocated == 0)
        return strata_errf(STRATA_ENOSPC, "arena needs %s, %s have %s free: %s",
                           shm_size_str(size, need), where, shm_size_str(avail, have), todo);
    return strata_errf(STRATA_ENOSPC, "arena needs %s, %s have %s free after %s of it: %s",
                       shm_size_str(size, need), where, shm_size_str(avail, have),
                       shm_size_str(allocated, done), todo);
}

/* large_pages enables SeLockMemoryPrivilege when this user holds it; the large-page minimum or 0.
 */
static SIZE_T large_pages(void)
{
    SIZE_T min = GetLargePageMinimum();
    HANDLE tok;
    if (!min || !OpenProcessToken(GetCurrentProcess(), TOKEN_ADJUST_PRIVILEGES, &tok)) return 0;
    TOKEN_PRIVILEGES tp = {.PrivilegeCount = 1};
    tp.Privileges[0].Attributes = SE_PRIVILEGE_ENABLED;
    bool ok = LookupPrivilegeValueW(NULL, L"SeLockMemoryPrivilege", &tp.Privileges[0].Luid) &&
              AdjustTokenPrivileges(tok, FALSE, &tp, 0, NULL, NULL) &&
              GetLastError() == ERROR_SUCCESS; /* ERROR_NOT_ALL_ASSIGNED: not held */
    CloseHandle(tok);
    return ok ? min : 0;
}

static int map_view(HANDLE m, uint64_t size, bool writable, const char *name, struct shm_seg *out)
{
    void *p = MapViewOfFile(m, writable ? FILE_MAP_WRITE | FILE_MAP_READ : FILE_MAP_READ, 0, 0,
                            (SIZE_T)size);
    if (!p) return win_err(GetLastError(), "map", name);
    out->h = (intptr_t)m;
    out->map = p;
    out->size = size;
    out->writable = writable;
    return 0;
}

/* create makes segname exclusively: a section of the paging file (reserved when sparse, large
 * pages where the privilege is held) or a file in dir of size bytes, mapped read-write. */
static int create(const char *dir, const char *segname, uint64_t size, bool sparse,
                  struct shm_seg *out)
{
    *out = (struct shm_seg)SHM_SEG_INIT;
    SECURITY_ATTRIBUTES sa;
    int rv;
    if (size == 0) return strata_errf(STRATA_EINVAL, "segment %s of 0 bytes", segname);
    if ((rv = owner_only(true, &sa)) != 0) return rv;
    wchar_t w[4096];
    HANDLE file = INVALID_HANDLE_VALUE, m = NULL;
    DWORD prot = PAGE_READWRITE;
    uint64_t want = size;
    if (in_paging_file(dir)) {
        if ((rv = object_name(segname, "", w, 4096)) != 0) goto out;
        SIZE_T lp = sparse ? 0 : large_pages();
        if (lp && size >= lp) {
            want = (size + lp - 1) / lp * lp;
            m = CreateFileMappingW(INVALID_HANDLE_VALUE, &sa, prot | SEC_COMMIT | SEC_LARGE_PAGES,
                                   (DWORD)(want >> 32), (DWORD)want, w);
            if (!m && GetLastError() == ERROR_ALREADY_EXISTS) goto exists;
            if (!m) want = size; /* no large pages after all: the ordinary way below */
        }
        if (!m) {
            prot |= sparse ? SEC_RESERVE : SEC_COMMIT;
            m = CreateFileMappingW(INVALID_HANDLE_VALUE, &sa, prot, (DWORD)(want >> 32),
                                   (DWORD)want, w);
        }
    } else {
        if ((rv = file_path(dir, segname, w, 4096)) != 0) goto out;
        file = CreateFileW(w, GENERIC_READ | GENERIC_WRITE | DELETE | READ_CONTROL | WRITE_DAC,
                           FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, &sa, CREATE_NEW,
                           FILE_ATTRIBUTE_TEMPORARY, NULL);
        if (file == INVALID_HANDLE_VALUE) {
            DWORD e = GetLastError();
            rv = e == ERROR_FILE_EXISTS
                     ? strata_errf(STRATA_EEXIST, "segment %s exists in %s", segname, dir)
                     : win_err(e, "create", segname);
            goto out;
        }
        LARGE_INTEGER end = {.QuadPart = (LONGLONG)size};
        if (!SetFilePointerEx(file, end, NULL, FILE_BEGIN) || !SetEndOfFile(file)) {
            DWORD e = GetLastError();
            /* a size past what the file system can hold is an invalid parameter there */
            rv = (e == ERROR_DISK_FULL || e == ERROR_HANDLE_DISK_FULL ||
                  e == ERROR_INVALID_PARAMETER)
                     ? no_space(dir, size, 0)
                     : win_err(e, "size", segname);
            goto out;
        }
        m = CreateFileMappingW(file, &sa, prot, 0, 0, NULL);
    }
    if (!m) {
        DWORD e = GetLastError();
        rv = (e == ERROR_COMMITMENT_LIMIT || e == ERROR_NOT_ENOUGH_MEMORY || e == ERROR_DISK_FULL)
                 ? no_space(dir, size, 0)
                 : win_err(e, "create the mapping of", segname);
        goto out;
    }
    if (GetLastError() == ERROR_ALREADY_EXISTS) goto exists;
    if ((rv = map_view(m, size, true, segname, out)) != 0) goto out;
    out->file = (intptr_t)file;
    LocalFree(sa.lpSecurityDescriptor);
    return 0;
exists:
    rv = strata_errf(STRATA_EEXIST, "segment %s exists", segname);
out:
    if (m) CloseHandle(m);
    if (file != INVALID_HANDLE_VALUE) {
        FILE_DISPOSITION_INFO del = {.DeleteFile = TRUE};
        SetFileInformationByHandle(file, FileDispositionInfo, &del, sizeof del);
        CloseHandle(file);
    }
    LocalFree(sa.lpSecurityDescriptor);
    *out = (struct shm_seg)SHM_SEG_INIT;
    return rv;
}

int shm_create(const char *dir, const char *segname, uint64_t size, struct shm_seg *out)
{
    return create(dir, segname, size, false, out);
}

int shm_create_sparse(const char *dir, const char *segname, uint64_t size, struct shm_seg *out)
{
    return create(dir, segname, size, true, out);
}

int shm_reserve(const char *dir, const struct shm_seg *s, uint64_t off, uint64_t len)
{
    /* A file in a directory is allocated when it is sized (NTFS is not sparse by default). A
     * paging-file section made sparse is SEC_RESERVE: its pages are committed here, in the view,
     * which commits them for every view of the section. */
    if (!in_paging_file(dir) || len == 0) return 0;
    if (off > s->size || len > s->size - off)
        return strata_errf(STRATA_EINVAL, "reserve past the end of a segment of %llu bytes",
                           (unsigned long long)s->size);
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    uint64_t page = si.dwPageSize, a = off / page * page;
    uint64_t b = (off + len + page - 1) / page * page;
    if (b > s->size) b = s->size;
    if (!VirtualAlloc(s->map + a, (SIZE_T)(b - a), MEM_COMMIT, PAGE_READWRITE)) {
        DWORD e = GetLastError();
        if (e == ERROR_COMMITMENT_LIMIT || e == ERROR_NOT_ENOUGH_MEMORY)
            return no_space(dir, s->size, a);
        return win_err(e, "commit pages of", "a segment");
    }
    return 0;
}

/* follow_link opens the segment a published link names. */
static int follow_link(const struct link_record *r, bool writable, struct shm_seg *out)
{
    wchar_t w[512];
    char target[sizeof r->target + 1];
    memcpy(target, r->target, sizeof r->target);
    target[sizeof r->target] = '\0';
    int rv = object_name(target, "", w, 512);
    if (rv) return rv;
    HANDLE m = OpenFileMappingW(
        READ_CONTROL | (writable ? FILE_MAP_WRITE | FILE_MAP_READ : FILE_MAP_READ), FALSE, w);
    if (!m) return win_err(GetLastError(), "open the segment", target);
    if ((rv = check_owner(m, SE_KERNEL_OBJECT, target)) != 0 ||
        (rv = map_view(m, r->size, writable, target, out)) != 0) {
        CloseHandle(m);
        return rv;
    }
    return 0;
}

int shm_open_seg(const char *dir, const char *segname, bool writable, bool group_write,
                 struct shm_seg *out)
{
    (void)group_write; /* no group on Windows: owner-only objects, checked by owner */
    *out = (struct shm_seg)SHM_SEG_INIT;
    wchar_t w[4096];
    int rv;
    DWORD access = READ_CONTROL | (writable ? FILE_MAP_WRITE | FILE_MAP_READ : FILE_MAP_READ);
    if (in_paging_file(dir)) {
        if ((rv = object_name(segname, "", w, 4096)) != 0) return rv;
        HANDLE m = OpenFileMappingW(access, FALSE, w);
        if (!m) {
            DWORD e = GetLastError();
            if (e == ERROR_FILE_NOT_FOUND)
                return strata_errf(STRATA_ENOENT, "no segment %s", segname);
            return win_err(e, "open", segname);
        }
        if ((rv = check_owner(m, SE_KERNEL_OBJECT, segname)) != 0) {
            CloseHandle(m);
            return rv;
        }
        /* a published name is a link to the segment; a segment opened by its own name (a build
         * in progress, its tmp name) is mapped whole */
        const struct link_record *r = MapViewOfFile(m, FILE_MAP_READ, 0, 0, sizeof *r);
        if (r && memcmp(r->magic, LINK_MAGIC, 16) == 0) {
            struct link_record copy = *r;
            UnmapViewOfFile(r);
            rv = follow_link(&copy, writable, out);
            if (rv == 0)
                out->link = (intptr_t)m;
            else
                CloseHandle(m);
            return rv;
        }
        if (r) UnmapViewOfFile(r);
        void *p =
            MapViewOfFile(m, writable ? FILE_MAP_WRITE | FILE_MAP_READ : FILE_MAP_READ, 0, 0, 0);
        MEMORY_BASIC_INFORMATION mi;
        if (!p || !VirtualQuery(p, &mi, sizeof mi)) {
            rv = win_err(GetLastError(), "map", segname);
            if (p) UnmapViewOfFile(p);
            CloseHandle(m);
            return rv;
        }
        static const char zero[16];
        if (mi.RegionSize <= sizeof(struct link_record) + 4096 && memcmp(p, zero, 16) == 0) {
            /* a link whose magic is not written yet: the segment is being published */
            UnmapViewOfFile(p);
            CloseHandle(m);
            return strata_errf(STRATA_ENOENT, "no segment %s yet (being published)", segname);
        }
        *out = (struct shm_seg)SHM_SEG_INIT;
        out->h = (intptr_t)m;
        out->map = p;
        out->size = mi.RegionSize;
        out->writable = writable;
        return 0;
    }
    if ((rv = file_path(dir, segname, w, 4096)) != 0) return rv;
    HANDLE file = CreateFileW(w, GENERIC_READ | READ_CONTROL | (writable ? GENERIC_WRITE : 0),
                              FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, NULL,
                              OPEN_EXISTING, FILE_FLAG_OPEN_REPARSE_POINT, NULL);
    if (file == INVALID_HANDLE_VALUE) {
        DWORD e = GetLastError();
        if (e == ERROR_FILE_NOT_FOUND || e == ERROR_PATH_NOT_FOUND)
            return strata_errf(STRATA_ENOENT, "no segment %s in %s", segname, dir);
        return win_err(e, "open", segname);
    }
    BY_HANDLE_FILE_INFORMATION fi;
    LARGE_INTEGER sz;
    HANDLE m = NULL;
    if (!GetFileInformationByHandle(file, &fi) || !GetFileSizeEx(file, &sz)) {
        rv = win_err(GetLastError(), "query", segname);
        goto fail;
    }
    if (fi.dwFileAttributes & FILE_ATTRIBUTE_REPARSE_POINT) {
        rv = strata_errf(STRATA_EPERM, "segment %s in %s is a link: refusing it", segname, dir);
        goto fail;
    }
    if ((rv = check_owner(file, SE_FILE_OBJECT, segname)) != 0) goto fail;
    if (sz.QuadPart <= 0) {
        rv = strata_errf(STRATA_EFORMAT, "segment %s is empty", segname);
        goto fail;
    }
    m = CreateFileMappingW(file, NULL, writable ? PAGE_READWRITE : PAGE_READONLY, 0, 0, NULL);
    if (!m) {
        rv = win_err(GetLastError(), "map", segname);
        goto fail;
    }
    if ((rv = map_view(m, (uint64_t)sz.QuadPart, writable, segname, out)) != 0) goto fail;
    out->file = (intptr_t)file;
    return 0;
fail:
    if (m) CloseHandle(m);
    CloseHandle(file);
    *out = (struct shm_seg)SHM_SEG_INIT;
    return rv;
}

void shm_close(struct shm_seg *s)
{
    if (s->map) UnmapViewOfFile(s->map);
    if (s->lock != SHM_NONE) {
        ReleaseMutex((HANDLE)s->lock);
        CloseHandle((HANDLE)s->lock);
    }
    if (s->link != SHM_NONE) CloseHandle((HANDLE)s->link);
    if (s->h != SHM_NONE) CloseHandle((HANDLE)s->h);
    if (s->file != SHM_NONE) CloseHandle((HANDLE)s->file);
    *s = (struct shm_seg)SHM_SEG_INIT;
}

int shm_lock(intptr_t h, bool exclusive, bool wait)
{
    OVERLAPPED ov = {0};
    DWORD flags =
        (exclusive ? LOCKFILE_EXCLUSIVE_LOCK : 0) | (wait ? 0 : LOCKFILE_FAIL_IMMEDIATELY);
    if (LockFileEx((HANDLE)h, flags, 0, MAXDWORD, MAXDWORD, &ov)) return 0;
    DWORD e = GetLastError();
    if (e == ERROR_LOCK_VIOLATION || e == ERROR_IO_PENDING) return STRATA_EBUSY;
    return win_err(e, "lock", "a file");
}

int shm_lock_seg(const char *dir, const char *segname, struct shm_seg *s, bool exclusive, bool wait)
{
    if (s->file != SHM_NONE) return shm_lock(s->file, exclusive, wait);
    (void)dir;
    if (!exclusive)
        return strata_errf(STRATA_EUNSUPPORTED,
                           "a shared lock on paging-file segment %s: only exclusive locks are "
                           "made for those (pass --shm-dir for file locks)",
                           segname);
    if (s->lock != SHM_NONE) return 0;
    wchar_t w[512];
    SECURITY_ATTRIBUTES sa;
    int rv;
    if ((rv = object_name(segname, ".lock", w, 512)) != 0) return rv;
    if ((rv = owner_only(true, &sa)) != 0) return rv;
    HANDLE mx = CreateMutexW(&sa, FALSE, w);
    DWORD e = GetLastError();
    LocalFree(sa.lpSecurityDescriptor);
    if (!mx) return win_err(e, "make the lock of", segname);
    if (e == ERROR_ALREADY_EXISTS && (rv = check_owner(mx, SE_KERNEL_OBJECT, segname)) != 0) {
        CloseHandle(mx);
        return rv;
    }
    DWORD r = WaitForSingleObject(mx, wait ? INFINITE : 0);
    if (r == WAIT_OBJECT_0 || r == WAIT_ABANDONED) { /* abandoned: its holder died; ours now */
        s->lock = (intptr_t)mx;
        return 0;
    }
    CloseHandle(mx);
    return r == WAIT_TIMEOUT ? STRATA_EBUSY : win_err(GetLastError(), "lock", segname);
}

bool shm_removed(const struct shm_seg *s)
{
    FILE_STANDARD_INFO fi;
    if (s->file == SHM_NONE) return false; /* a paging-file section has no name to lose */
    return GetFileInformationByHandleEx((HANDLE)s->file, FileStandardInfo, &fi, sizeof fi) &&
           (fi.DeletePending || fi.NumberOfLinks == 0);
}

int shm_publish(const char *dir, struct shm_seg *s, const char *tmpname, const char *segname,
                unsigned mode)
{
    bool writable = (mode & 0200) != 0;
    SECURITY_ATTRIBUTES sa;
    int rv;
    if (!FlushViewOfFile(s->map, 0)) return win_err(GetLastError(), "flush", tmpname);
    if ((rv = owner_only(writable, &sa)) != 0) return rv;
    /* the segment's DACL becomes owner read (0400) or owner read-write (0600) */
    BOOL present = FALSE, defaulted = FALSE;
    PACL dacl = NULL;
    DWORD e;
    bool file = s->file != SHM_NONE;
    if (GetSecurityDescriptorDacl(sa.lpSecurityDescriptor, &present, &dacl, &defaulted) &&
        (e = SetSecurityInfo(file ? (HANDLE)s->file : (HANDLE)s->h,
                             file ? SE_FILE_OBJECT : SE_KERNEL_OBJECT,
                             DACL_SECURITY_INFORMATION | PROTECTED_DACL_SECURITY_INFORMATION, NULL,
                             NULL, dacl, NULL)) != ERROR_SUCCESS) {
        rv = win_err(e, "set the permissions of", tmpname);
        goto out;
    }
    if (in_paging_file(dir)) {
        wchar_t w[512];
        if (strlen(tmpname) >= sizeof((struct link_record *)0)->target) {
            rv = strata_errf(STRATA_EOVERFLOW, "segment name %s too long", tmpname);
            goto out;
        }
        if ((rv = object_name(segname, "", w, 512)) != 0) goto out;
        HANDLE m = CreateFileMappingW(INVALID_HANDLE_VALUE, &sa, PAGE_READWRITE, 0,
                                      sizeof(struct link_record), w);
        e = GetLastError();
        if (!m) {
            rv = win_err(e, "publish", segname);
            goto out;
        }
        if (e == ERROR_ALREADY_EXISTS) {
            CloseHandle(m);
            rv = strata_errf(STRATA_EEXIST,
                             "segment %s is still held open by another process: stop it first",
                             segname);
            goto out;
        }
        /* the target's name and size first, the magic last: a reader that opens the name before
         * the magic is there sees no segment yet */
        struct link_record *r = MapViewOfFile(m, FILE_MAP_WRITE, 0, 0, sizeof *r);
        if (!r) {
            rv = win_err(GetLastError(), "publish", segname);
            CloseHandle(m);
            goto out;
        }
        r->size = s->size;
        memcpy(r->target, tmpname, strlen(tmpname) + 1);
        MemoryBarrier();
        memcpy(r->magic, LINK_MAGIC, 16);
        UnmapViewOfFile(r);
        if (s->link != SHM_NONE) CloseHandle((HANDLE)s->link);
        s->link = (intptr_t)m;
        rv = 0;
        goto out;
    }
    wchar_t from[4096], to[4096];
    if ((rv = file_path(dir, tmpname, from, 4096)) != 0 ||
        (rv = file_path(dir, segname, to, 4096)) != 0)
        goto out;
    if (!MoveFileExW(from, to, MOVEFILE_REPLACE_EXISTING)) {
        rv = win_err(GetLastError(), "rename to", segname);
        goto out;
    }
    rv = 0;
out:
    LocalFree(sa.lpSecurityDescriptor);
    return rv;
}

int shm_remove(const char *dir, const char *segname)
{
    if (in_paging_file(dir)) return 0;
    wchar_t w[4096];
    int rv = file_path(dir, segname, w, 4096);
    if (rv) return rv;
    if (!DeleteFileW(w)) {
        DWORD e = GetLastError();
        if (e == ERROR_FILE_NOT_FOUND || e == ERROR_PATH_NOT_FOUND) return 0;
        return win_err(e, "remove", segname);
    }
    return 0;
}
