/* Prints every name in csrc/hook_symbols.h, one a line: the test compares it with `nm -D`. */
#include <stdio.h>

#include "hook_symbols.h"

int main(void)
{
#define PRINT_NAME(name, ...) puts(#name);
    NVSHARE_SYMBOLS(PRINT_NAME, PRINT_NAME)
    return 0;
}
