/* drc_version(): the version of the library that is loaded (drc.h's DRC_VERSION_* are the header's). */
#include <drc.h>

#define STR_(x) #x
#define STR(x)  STR_(x)

const char *drc_version(unsigned *major, unsigned *minor, unsigned *patch)
{
    if (major)
        *major = DRC_VERSION_MAJOR;
    if (minor)
        *minor = DRC_VERSION_MINOR;
    if (patch)
        *patch = DRC_VERSION_PATCH;
    return STR(DRC_VERSION_MAJOR) "." STR(DRC_VERSION_MINOR) "." STR(DRC_VERSION_PATCH);
}
