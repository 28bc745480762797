"""mmrlvr.consistency"""
