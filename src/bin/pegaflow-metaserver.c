#include "app/app.h"

int main(int argc, char **argv)
{
    return pf_metaserver_main(argc, argv);
}
