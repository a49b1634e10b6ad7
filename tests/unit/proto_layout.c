/* proto_layout.c: the C compiler's view of csrc/nvshare_proto.h, for tests/unit/test_proto.py.
 *
 * Prints one line per struct ("S name size") and per field ("F name.field offset size"). The field
 * list comes from NVSHARE_LAYOUT_LIST, a file the test writes from the header's own text, so a new
 * struct or field is covered without editing this program.
 */
#include <stddef.h>
#include <stdio.h>

#include "nvshare_proto.h"

#define STRUCT(s) printf("S %s %zu\n", #s, sizeof(struct s));
#define FIELD(s, f) \
    printf("F %s.%s %zu %zu\n", #s, #f, offsetof(struct s, f), sizeof(((struct s *)0)->f));

int main(void)
{
#include NVSHARE_LAYOUT_LIST
    printf("D NVSHARE_HDR_SIZE %d\n", NVSHARE_HDR_SIZE);
    return 0;
}
